"""Where a generate call's time outside its decode phase goes, on the CPU, with the tiny random
Llama of bench_host_step_cpu.py (4 layers, width 128, dummy weights), whose steps are mostly
host work, as a GPU step's host side is.

Why: at batch 16 on the H100 (session 65) the time outside the decode phase was 49-135 ms a
run in every engine, about 12% of it, and decided issue 12's ours/native figure as much as the
decode phase did. tests/engine_runner.py's ``start_phase_ms`` splits it from the requests'
engine timestamps: ``arrival`` (first to last request queued in the engine core: the caller's
hand-over), ``first_token`` (to the last request's first token) and ``outside_core``. This
runs each method's engine with its engine core in a process of its own, as the GPU benchmark
does, so that requests reach the core one by one while it steps.

    python benchmarks/start_phase_cpu.py [--methods none,eagle3] [--batches 1,16] [--repeats 5]

Prints, per method and batch, the medians over the timed runs (ms; decode in ms per token) and
the runs themselves. Synthetic acceptance 3.0, K=4, prompts in the prefix cache after the
warm-up (as in the GPU benchmark).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpu_models import FAMILIES, repeated_random_prompt, synthetic_spec_configs, write_configs  # noqa: E402
from tests.engine_runner import decode_ms_per_token, start_phase_ms  # noqa: E402

FAMILY = "tiny-4l"


def measure(method: str, batches: list[int], repeats: int, work: str) -> dict:
    from vllm import LLM, SamplingParams

    paths = write_configs(work, FAMILY)
    spec = synthetic_spec_configs(paths, 3.0, 4)[method]
    llm = LLM(model=paths["target"], dtype="float32", load_format="dummy",
              skip_tokenizer_init=True, max_model_len=512, seed=0, max_num_seqs=max(batches),
              kv_cache_memory_bytes=96 << 20, speculative_config=spec,
              disable_log_stats=False)  # the requests' engine timestamps
    vocab = FAMILIES[FAMILY]["target"]["vocab_size"]
    params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    found = {}
    for batch in batches:
        requests = [{"prompt_token_ids": repeated_random_prompt(vocab=vocab, seed=s)}
                    for s in range(batch)]
        llm.generate(requests, params, use_tqdm=False)  # warm-up: the prompts get cached
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            outputs = llm.generate(requests, params, use_tqdm=False)
            wall = time.perf_counter() - t0
            runs.append({"wall": 1000 * wall, "decode": decode_ms_per_token(outputs),
                         **start_phase_ms(outputs, wall)})
        found[batch] = {"median": {key: statistics.median(r[key] for r in runs)
                                   for key in runs[0]}, "runs": runs}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="none,eagle3")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work", default="/tmp/specdec_start_phase_models")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    for method in args.methods.split(","):
        for batch, entry in measure(method, batches, args.repeats, args.work).items():
            median = {key: round(value, 2) for key, value in entry["median"].items()}
            print(f"{method} batch {batch}: {json.dumps(median)}")
            print("  runs:", json.dumps([{k: round(v, 1) for k, v in r.items()}
                                         for r in entry["runs"]]))


if __name__ == "__main__":
    main()
