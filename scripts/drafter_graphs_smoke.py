"""Quick GPU check of our drafter graphs: SmolLM2 engines with graphs on and off, side by side.

    python scripts/drafter_graphs_smoke.py [--methods eagle,draft_model] [--dtype bfloat16]

Prints, per engine: drafter graphs recorded/failed, ms/token at batch 1 and 8, acceptance
length. Engines run in parallel processes (tests/engine_runner.py), so the timings are
only a sanity check; the side-by-side benchmark is the measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> None:
    from tests.engine_runner import run_in_subprocess
    from tests.prompts_gpu import BENCH_PROMPTS

    from specdec_plugin.models import fetch_smollm2
    from tests.spec_configs import spec_config

    parser = argparse.ArgumentParser()
    parser.add_argument("--methods", default="eagle,draft_model")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default=None, help="write every engine's result as JSON here")
    args = parser.parse_args()
    smollm2 = str(fetch_smollm2())
    jobs = {}
    for method in args.methods.split(","):
        for graphs in ("1", "0"):
            jobs[f"{method} graphs={graphs}"] = {
                "backend": "ours", "model": smollm2, "prompts": BENCH_PROMPTS, "max_tokens": 64,
                "batches": [1, 8], "repeats": 3, "warmups": 2,
                "env": {"SPECDEC_DRAFTER_GRAPHS": graphs},
                "engine": {"dtype": args.dtype, "max_model_len": 1024,
                           "kv_cache_memory_bytes": 1 << 30, "gpu_memory_utilization": 0.1,
                           "enable_prefix_caching": False,
                           "speculative_config": spec_config(method, "")},
            }
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(run_in_subprocess, job, 900) for name, job in jobs.items()}
        results = {name: future.result() for name, future in futures.items()}
    for name, result in results.items():
        if "batches" not in result:
            print(name, "FAILED", result.get("stderr_tail", result)[-2000:])
            continue
        cells = [f"b{b}: {e['ms_per_token']:.2f} ms/tok AL {e.get('acceptance_length', 0):.3f}"
                 for b, e in result["batches"].items()]
        print(f"{name:24s} graphs {result['drafter_graphs']}  " + "  ".join(cells))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
