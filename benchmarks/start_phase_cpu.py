"""Where a generate call's time outside its decode phase goes, on the CPU, with the tiny random
Llama of bench_host_step_cpu.py (4 layers, width 128, dummy weights), whose steps are mostly
host work, as a GPU step's host side is.

Why: at batch 16 on the H100 (session 65) the time outside the decode phase was 49-135 ms a
run in every engine, about 12% of it, and decided issue 12's ours/native figure as much as the
decode phase did. tests/engine_runner.py's ``start_phase_ms`` splits it from the requests'
engine timestamps: ``arrival`` (first to last request queued in the engine core: the caller's
hand-over), ``first_token`` (to the last request's first token) and ``outside_core``. Each
method's engine runs through tests/engine_runner.py, as the GPU benchmark's do (the same
warm-up, timed runs and figures), with its engine core in a process of its own, so that
requests reach the core one by one while it steps.

    python benchmarks/start_phase_cpu.py [--methods none,eagle3] [--batches 1,16] [--repeats 5]

Prints, per method and batch, the medians over the timed runs (ms; decode in ms per token) and
the runs themselves. Synthetic acceptance 3.0, K=4, prompts in the prefix cache after the
warm-up (as in the GPU benchmark).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpu_models import FAMILIES, repeated_random_prompt, synthetic_spec_configs, write_configs  # noqa: E402
from tests.engine_runner import run_in_subprocess  # noqa: E402

FAMILY = "tiny-4l"


def job(method: str, batches: list[int], repeats: int, work: str) -> dict:
    """The engine_runner job of one method's engine (engine_runner adds ``seed`` and keeps
    log stats on, whose request timestamps the split reads)."""
    paths = write_configs(work, FAMILY)
    vocab = FAMILIES[FAMILY]["target"]["vocab_size"]
    return {"backend": "ours", "model": paths["target"], "max_tokens": 128,
            "batches": batches, "repeats": repeats, "warmups": 1,
            "prompt_token_ids": [repeated_random_prompt(vocab=vocab, seed=s)
                                 for s in range(max(batches))],
            "engine": {"dtype": "float32", "load_format": "dummy", "skip_tokenizer_init": True,
                       "max_model_len": 512, "max_num_seqs": max(batches),
                       "kv_cache_memory_bytes": 96 << 20,
                       "speculative_config": synthetic_spec_configs(paths, 3.0, 4)[method]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="none,eagle3")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work", default="/tmp/specdec_start_phase_models")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    for method in args.methods.split(","):
        result = run_in_subprocess(job(method, batches, args.repeats, args.work))
        if "error" in result:
            raise SystemExit(f"{method}: {result['error']}\n{result['stderr_tail']}")
        for batch, entry in result["batches"].items():
            median = {"wall": 1000 * entry["wall_s"], "decode": entry["decode_ms_per_token"],
                      **entry["start_phase_ms"]}
            print(f"{method} batch {batch}: "
                  + json.dumps({k: round(v, 2) for k, v in median.items()}))
            print("  runs:", json.dumps([{"wall": round(1000 * w, 1),
                                          **{k: round(v, 1) for k, v in phase.items()}}
                                         for w, phase in zip(entry["walls_s"],
                                                             entry["start_phase_ms_runs"])]))


if __name__ == "__main__":
    main()
