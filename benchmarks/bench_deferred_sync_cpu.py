"""What speculation costs on CPU when every draft misses: EAGLE-3 with deferred drafter KV sync
off, on with full flushes and on with KV-only flushes, against plain decoding (issue 11,
spec_decode/deferred_sync.py, spec_decode/drafter_kv_writer.py).

Four engines live side by side (SmolLM2 fp32; EAGLE-3 with vLLM's synthetic rejection at
acceptance length 1.0, so every draft token is rejected and the adaptive controller drafts
nothing but its probes), and each round times one ``generate`` on each, in rotating order,
so load from other processes falls on all of them alike. Prints ms per decode step (wall time
of the call / max_tokens) per engine, the median over rounds, and the ratio to plain.

    python benchmarks/bench_deferred_sync_cpu.py [--batch 1,8] [--rounds 5] [--max-tokens 96]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time


# Run in each engine's worker (LLM.collective_rpc): time the drafter's propose calls, the
# work deferral removes, apart from the rest of the step (less noisy than the wall clock of
# whole steps on a shared machine).
def _time_drafter(worker):
    drafter = worker.model_runner.drafter
    propose = type(drafter).propose
    drafter.timing = [0.0, 0]

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return propose(drafter, *args, **kwargs)
        finally:
            drafter.timing[0] += time.perf_counter() - start
            drafter.timing[1] += 1

    drafter.propose = timed


def _take_timing(worker):
    drafter = worker.model_runner.drafter
    seconds, calls = drafter.timing
    drafter.timing = [0.0, 0]
    sync = getattr(drafter, "_deferred_sync", None)
    return seconds, calls, None if sync is None else (sync.deferred_steps, sync.flushes)


def build(smollm2: str, spec: dict | None, defer: bool, kv_only: bool = True):
    from vllm import LLM

    os.environ["SPECDEC_ADAPTIVE"] = "1"
    os.environ["SPECDEC_DEFER_DRAFTER_SYNC"] = "1" if defer else "0"
    os.environ["SPECDEC_KV_ONLY_FLUSH"] = "1" if kv_only else "0"
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
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # callables to the workers
    engines = {"plain": build(smollm2, None, False), "defer_off": build(smollm2, spec, False),
               "defer_full_flush": build(smollm2, spec, True, kv_only=False),
               "defer_on": build(smollm2, spec, True)}
    timed = ("defer_off", "defer_full_flush", "defer_on")
    for name in timed:
        engines[name].collective_rpc(_time_drafter)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    words = ["river", "market", "winter", "garden", "station", "letter", "harbor", "forest"]
    results = {}
    for batch in (int(b) for b in args.batch.split(",")):
        times = {name: [] for name in engines}
        drafter_ms = {name: [] for name in timed}
        stats = {}
        names = list(engines)
        for r in range(args.rounds + 1):  # round 0 warms up
            prompts = [f"Write a short story about a {words[(i + r) % len(words)]} "
                       f"(take {r}, reader {i})." for i in range(batch)]
            turn = r % len(names)
            for name in names[turn:] + names[:turn]:
                start = time.perf_counter()
                engines[name].generate(prompts, params, use_tqdm=False)
                if name in drafter_ms:
                    [(seconds, calls, stats[name])] = engines[name].collective_rpc(_take_timing)
                if r:
                    times[name].append((time.perf_counter() - start) / args.max_tokens * 1e3)
                    if name in drafter_ms:
                        drafter_ms[name].append(seconds / calls * 1e3)
        med = {name: statistics.median(t) for name, t in times.items()}
        drafter_med = {name: statistics.median(t) for name, t in drafter_ms.items()}
        results[batch] = {"ms_per_step": times, "median": med, "drafter_ms_per_step": drafter_ms,
                          "drafter_median": drafter_med, "defer_on_stats": stats["defer_on"],
                          "defer_full_flush_stats": stats["defer_full_flush"]}
        print(f"batch {batch}: drafter propose per step: " + ", ".join(
            f"{name} {v:.3f} ms" for name, v in drafter_med.items())
            + f"  (deferred steps, flushes so far: KV-only {stats['defer_on']}, full "
            f"{stats['defer_full_flush']})", flush=True)
        print(f"batch {batch}: " + ", ".join(
            f"{name} {med[name]:.2f} ms/step ({med[name] / med['plain']:.3f}x plain)"
            for name in engines) + "  rounds: " + json.dumps(
            {n: [round(x, 2) for x in t] for n, t in times.items()}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
