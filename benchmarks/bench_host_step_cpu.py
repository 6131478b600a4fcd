"""Host work per engine step of each speculative method at k = 0, on the CPU, against plain.

Why: on an H200 (2026-11-28), bench_paired_plain.py at acceptance length 1.0 (every draft
rejected, so the adaptive controller runs plain k = 0 steps plus a few one-token probes)
showed the speculative engines 1.06-1.18x plain decoding at batch 64 and none at batch 1/16.
The suspicion: a speculative engine's host (Python) work per step at batch 64 reaches the
~5 ms GPU step, so async scheduling no longer hides it. This script measures that host work
where it is all there is: a TINY random Llama (4 layers, hidden 128, vocab 2048,
``load_format="dummy"``; gpu_models.py's "tiny-4l" family) and tiny random drafters, so the
forward is negligible and a step's time is the host's. All engines live in this process
(in-process engine cores); each round runs one ``generate`` per engine in rotating order, so
drift between minutes falls on all alike; ms/step is wall / engine steps, the ratio to
``none`` is taken round by round and the median printed. Parts are timed by wrappers
(perf_counter around the call, as profile_cpu_step.py), per engine, summed over timed rounds.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_host_step_cpu.py \
        [--batches 64,16,1] [--methods none,eagle,eagle3,draft_model,ngram,suffix] [--rounds 5] \
        [--acceptance-length 1.0] [--cprofile eagle] [--json out.json]

Differences from the GPU: no async scheduling on CPU (config_defaults.py turns it off), so the
scheduler is the sync AdaptiveScheduler and host work adds to the step instead of overlapping;
no CUDA graphs (drafter graph replays, padding) and no device syncs.
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from gpu_models import (  # noqa: E402  (benchmarks/ is this script's folder)
    FAMILIES,
    repeated_random_prompt,
    synthetic_spec_configs,
    tiny_cpu_engine,
    write_configs,
)

FAMILY = "tiny-4l"  # a 4-layer Llama of width 128 and drafters shaped as the 7B family's
VOCAB = FAMILIES[FAMILY]["target"]["vocab_size"]

TOTALS: dict[str, float] = collections.defaultdict(float)
COUNTS: dict[str, int] = collections.defaultdict(int)


def _wrap(owner, name: str, label: str, split_k: bool = False) -> None:
    """split_k: also book the call under label + " [probe steps]" when the step drafts
    (the scheduler output, args[1], asks for k > 0)."""
    fn = getattr(owner, name, None)
    if fn is None:
        return

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            TOTALS[label] += dt
            COUNTS[label] += 1
            if split_k and getattr(args[1], "num_spec_tokens_to_schedule", 0):
                TOTALS[label + " [probe steps]"] += dt

    setattr(owner, name, timed)


def install_wrappers() -> None:
    """Class-level, before any engine exists (EngineCore binds step_fn at construction)."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    from specdec_plugin.adaptive.controller import DraftLengthController
    from specdec_plugin.spec_decode import deferred_sync as ds
    from specdec_plugin.worker.model_runner import SpecDecModelRunner as R

    _wrap(EngineCore, "step", "step")
    _wrap(Scheduler, "schedule", "sched.schedule")
    _wrap(DraftLengthController, "choose", "sched.schedule/controller.choose")
    _wrap(Scheduler, "update_from_output", "sched.update_from_output")
    _wrap(DraftLengthController, "observe", "sched.update/controller.observe")
    _wrap(DraftLengthController, "observe_step_time", "sched.update/controller.observe_step_time")
    _wrap(R, "execute_model", "runner.execute_model", True)
    _wrap(R, "_update_states", "runner.execute/_update_states")
    _wrap(R, "_prepare_inputs", "runner.execute/_prepare_inputs")
    _wrap(R, "_build_attention_metadata", "runner.execute/_build_attention_metadata")
    _wrap(R, "_model_forward", "runner.execute/_model_forward")
    _wrap(R, "sample_tokens", "runner.sample_tokens")
    _wrap(R, "_sample", "runner.sample/_sample")
    _wrap(R, "_bookkeeping_sync", "runner.sample/_bookkeeping_sync")
    _wrap(R, "propose_draft_token_ids", "runner.sample/propose_draft_token_ids", True)
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer as P
    _wrap(P, "prepare_next_token_ids_padded", "runner.sample/propose/prepare_next_token_ids_padded")
    _wrap(P, "propose", "runner.sample/propose/vllm propose (flush, probe passes)")
    _wrap(ds.DeferredDrafterSync, "step", "runner.sample/propose/deferred.step")
    _wrap(ds.DeferredDrafterSync, "_flush", "runner.sample/propose/deferred.flush")


def hook_forwards(llm, name: str) -> None:
    """Time the target's and the drafter's model forwards (device work on a GPU)."""
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    drafter = getattr(getattr(runner, "drafter", None), "model", None)
    for label, model in (("fwd target", runner.model), ("fwd drafter", drafter)):
        if not isinstance(model, __import__("torch").nn.Module):
            continue
        start = []
        model.register_forward_pre_hook(lambda m, a, s=start: s.append(time.perf_counter()))

        def post(m, a, o, s=start, label=label):
            TOTALS[label] += time.perf_counter() - s.pop()
            COUNTS[label] += 1
        model.register_forward_hook(post)


def prompts(batch: int, seed: int) -> list[dict]:
    """16 random ids repeated 4 times, different for each request and round."""
    return [{"prompt_token_ids": repeated_random_prompt(16, 4, VOCAB, seed * 1000 + i)}
            for i in range(batch)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="64,16,1")
    p.add_argument("--methods", default="none,eagle,eagle3,draft_model,ngram,suffix")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--acceptance-length", type=float, default=1.0,
                   help="vLLM's synthetic acceptance length (1.0: every draft rejected, the "
                        "k = 0 steps above; 3.0: issue 12's drafting steps, whose outputs then "
                        "differ from plain decoding's: synthetic acceptance keeps drafts unchecked)")
    p.add_argument("--cprofile", default="", help="comma list of methods: cProfile their "
                   "extra round at the first batch (plugin and proposer functions by cumulative time; "
                   "all in $TMPDIR/host_step_METHOD_BATCH.prof)")
    p.add_argument("--json", default=None)
    p.add_argument("--no-decision-cache", action="store_true", help="the controller runs its "
                   "policy every step (the 'before' of its kept decision, controller.py)")
    args = p.parse_args()

    install_wrappers()
    if args.no_decision_cache:  # no decision is ever kept: the policy runs every step
        from specdec_plugin.adaptive.controller import DraftLengthController
        DraftLengthController._decision_key = property(lambda self: None, lambda self, v: None)
    from vllm import SamplingParams

    models = tempfile.TemporaryDirectory(prefix="host_step_")  # removed at exit
    paths = write_configs(models.name, FAMILY)
    specs = synthetic_spec_configs(paths, args.acceptance_length, args.k)
    methods = args.methods.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    engines, failed = {}, {}
    for m in methods:
        try:
            engines[m] = tiny_cpu_engine(paths["target"], specs[m], max(batches))
        except Exception as e:  # noqa: BLE001  (report what does not run on CPU)
            failed[m] = f"{type(e).__name__}: {e}"[:300]
            print(f"{m}: did not start: {failed[m]}", flush=True)
            continue
        hook_forwards(engines[m], m)
    names = list(engines)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    results = {"failed": failed, "batches": {}}
    for batch in batches:
        ms = {n: [] for n in names}
        host = {n: [] for n in names}
        parts = {n: collections.defaultdict(float) for n in names}
        steps = {n: 0 for n in names}
        same = {n: True for n in names}
        profiled = [m for m in args.cprofile.split(",") if m in names] if batch == batches[0] else []
        for r in range(args.rounds + 1 + bool(profiled)):  # round 0 warms up; last: cProfile
            outputs = {}
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                TOTALS.clear()
                COUNTS.clear()
                prof = None
                if r > args.rounds and n not in profiled:
                    continue
                if r > args.rounds:
                    prof = cProfile.Profile()
                    prof.enable()
                t0 = time.perf_counter()
                outs = engines[n].generate(prompts(batch, r), params, use_tqdm=False)
                wall = time.perf_counter() - t0
                if prof is not None:
                    prof.disable()
                    prof.dump_stats(f"{tempfile.gettempdir()}/host_step_{n}_{batch}.prof")
                    s = io.StringIO()
                    st = pstats.Stats(prof, stream=s).sort_stats("cumulative")
                    st.print_stats(r"spec_decode|adaptive|proposer|eagle|draft_model|suffix|ngram", 40)
                    print(f"--- cProfile {n} batch {batch} (profiled round, slower) ---\n"
                          + s.getvalue(), flush=True)
                    continue
                outputs[n] = [list(o.outputs[0].token_ids) for o in outs]
                if r:
                    ms[n].append(wall / COUNTS["step"] * 1e3)
                    host[n].append((TOTALS["step"] - TOTALS["fwd target"] - TOTALS["fwd drafter"])
                                   / COUNTS["step"] * 1e3)
                    steps[n] += COUNTS["step"]
                    for label, v in TOTALS.items():
                        parts[n][label] += v
            if "none" in outputs:
                for n in outputs:
                    same[n] &= outputs[n] == outputs["none"]
        med = {n: statistics.median(v) for n, v in ms.items()}
        rounds = min(len(v) for v in ms.values())
        ratio = {n: statistics.median(ms[n][i] / ms["none"][i] for i in range(rounds))
                 for n in names} if "none" in ms else {}
        host_med = {n: statistics.median(v) for n, v in host.items()}
        host_ratio = {n: statistics.median(host[n][i] / host["none"][i] for i in range(rounds))
                      for n in names} if "none" in host else {}
        print(f"\n== batch {batch}: ms/step (median of {rounds} rounds) and paired ratio to none; "
              f"the same for host time (step - model forwards); greedy output == none", flush=True)
        for n in names:
            print(f"  {n:<12} {med[n]:7.3f} ms/step  x{ratio.get(n, float('nan')):.3f}   host "
                  f"{host_med[n]:6.3f} ms/step  x{host_ratio.get(n, float('nan')):.3f}  "
                  f"same={same.get(n)}  rounds={[round(x, 2) for x in ms[n]]}", flush=True)
        for n in names:  # what is left when the forwards (device work on a GPU) are taken out
            parts[n]["host = step - fwd target - fwd drafter"] = (
                parts[n]["step"] - parts[n]["fwd target"] - parts[n]["fwd drafter"])
        labels = sorted({lab for n in names for lab in parts[n]})
        print(f"  part (ms per step){'':<34}" + "".join(f"{n[:11]:>12}" for n in names))
        for lab in labels:
            print(f"  {lab:<52}" + "".join(
                f"{parts[n][lab] / max(steps[n], 1) * 1e3:12.3f}" for n in names))
        results["batches"][batch] = {
            "ms_per_step": ms, "median": med, "ratio": ratio, "host_ms_per_step": host,
            "host_ratio": host_ratio, "same_output": same,
            "parts_ms_per_step": {n: {lab: v / max(steps[n], 1) * 1e3
                                      for lab, v in parts[n].items()} for n in names}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
