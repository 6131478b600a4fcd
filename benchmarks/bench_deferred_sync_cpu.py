"""What speculation costs on CPU when every draft misses: EAGLE-3 with deferred drafter KV sync
on and off, against plain decoding (issue 11, spec_decode/deferred_sync.py).

Three engines live side by side (SmolLM2 fp32; EAGLE-3 with vLLM's synthetic rejection at
acceptance length 1.0, so every draft token is rejected and the adaptive controller drafts
nothing but its probes), and each round times one ``generate`` on each, in rotating order,
so load from other processes falls on all three alike. Prints ms per decode step (wall time
of the call / max_tokens) per engine, the median over rounds, and the ratio to plain.

    python benchmarks/bench_deferred_sync_cpu.py [--batch 1,8] [--rounds 5] [--max-tokens 96]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def build(smollm2: str, spec: dict | None, defer: bool):
    from vllm import LLM

    os.environ["SPECDEC_ADAPTIVE"] = "1"
    os.environ["SPECDEC_DEFER_DRAFTER_SYNC"] = "1" if defer else "0"
    return LLM(model=smollm2, dtype="float32", max_model_len=1024, seed=0,
               enable_prefix_caching=False, speculative_config=spec)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from vllm import SamplingParams

    from specdec_plugin.models import fetch_smollm2
    from specdec_plugin.models.drafters import speculative_config

    smollm2 = str(fetch_smollm2())
    spec = {**speculative_config("eagle3", 3), "rejection_sample_method": "synthetic",
            "synthetic_acceptance_length": 1.0}
    engines = {"plain": build(smollm2, None, False), "defer_off": build(smollm2, spec, False),
               "defer_on": build(smollm2, spec, True)}
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    words = ["river", "market", "winter", "garden", "station", "letter", "harbor", "forest"]
    results = {}
    for batch in (int(b) for b in args.batch.split(",")):
        times = {name: [] for name in engines}
        names = list(engines)
        for r in range(args.rounds + 1):  # round 0 warms up
            prompts = [f"Write a short story about a {words[(i + r) % len(words)]} "
                       f"(take {r}, reader {i})." for i in range(batch)]
            for name in names[r % 3:] + names[:r % 3]:
                start = time.perf_counter()
                engines[name].generate(prompts, params, use_tqdm=False)
                if r:
                    times[name].append((time.perf_counter() - start) / args.max_tokens * 1e3)
        med = {name: statistics.median(t) for name, t in times.items()}
        results[batch] = {"ms_per_step": times, "median": med}
        print(f"batch {batch}: " + ", ".join(
            f"{name} {med[name]:.2f} ms/step ({med[name] / med['plain']:.3f}x plain)"
            for name in engines) + "  rounds: " + json.dumps(
            {n: [round(x, 2) for x in t] for n, t in times.items()}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
