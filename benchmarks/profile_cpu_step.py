"""Where a CPU decode step goes: wall time per part of the step, in-process engine.

    python benchmarks/profile_cpu_step.py [--batch 1] [--max-tokens 64] [--method none|ngram|...]

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and the parts are
timed by wrapping them (perf_counter around the call, nested parts subtracted by the reader):
the engine step, the scheduler, input preparation, the model forward and, inside it, each
module type (attention, linear layers, norms, rotary, activation, embedding), the logits, the
sampler and the proposer (the drafter's greedy sampling, LM head included, apart). Wrappers
cost about a microsecond each, not a profiler's overhead, so the totals match an unwrapped run
to a few percent. Prints ms per engine step.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# What the served engine runs with (device/cpu.py's process_env reaches a spawned engine core
# before torch starts OpenMP; in this process it would come too late). Without it OpenMP's team
# spins between parallel regions and the in-process profile measures another engine: on a
# 2-core Xeon, 2026-11-25, the linear layers' helper threads then competed with a spinning
# OpenMP thread and batch 8 read 140 tok/s against 154 with passive waiting.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

TOTALS: dict[str, float] = collections.defaultdict(float)
COUNTS: dict[str, int] = collections.defaultdict(int)


def _wrap(owner, name: str, label: str) -> None:
    fn = getattr(owner, name)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TOTALS[label] += time.perf_counter() - t0
            COUNTS[label] += 1

    setattr(owner, name, timed)


def _hook_modules(model) -> None:
    """Time every leaf-ish module by its type with forward hooks."""
    kinds = {
        "QKVParallelLinear": "linear", "RowParallelLinear": "linear",
        "MergedColumnParallelLinear": "linear", "RMSNorm": "norm",
        "SiluAndMul": "activation", "VocabParallelEmbedding": "embedding",
        "Attention": "attention (layer incl. KV write)",
    }
    for module in model.modules():
        # Our out-of-tree layers are named SpecDec<vLLM class> (ops/custom_ops.py).
        kind = kinds.get(type(module).__name__.removeprefix("SpecDec"))
        if kind is None and "RotaryEmbedding" in type(module).__name__:
            kind = "rotary"
        if kind is None:
            continue
        start = {}

        def pre(mod, args, kind=kind, start=start):
            start[id(mod)] = time.perf_counter()

        def post(mod, args, out, kind=kind, start=start):
            TOTALS["fwd/" + kind] += time.perf_counter() - start.pop(id(mod))
            COUNTS["fwd/" + kind] += 1

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--method", default="none")
    p.add_argument("--engine", default="{}", help="extra LLM(...) arguments as JSON")
    p.add_argument("--json", default=None)
    p.add_argument("--providers", default=None,
                   help="comma list overriding the CPU kernel providers (torch: the 'before')")
    args = p.parse_args()
    if args.providers:
        from specdec_plugin.device.cpu import CpuDevice

        CpuDevice.kernel_providers = tuple(args.providers.split(","))

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    from specdec_plugin.models import fetch_smollm2
    from specdec_plugin.worker.model_runner import SpecDecModelRunner

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_cpu_vs_transformers import PROMPTS

    _wrap(EngineCore, "step", "engine step")
    _wrap(EngineCore, "step_with_batch_queue", "engine step")
    _wrap(Scheduler, "schedule", "scheduler.schedule")
    _wrap(Scheduler, "update_from_output", "scheduler.update_from_output")
    _wrap(SpecDecModelRunner, "execute_model", "runner.execute_model")
    _wrap(SpecDecModelRunner, "_prepare_inputs", "runner._prepare_inputs")
    _wrap(SpecDecModelRunner, "_model_forward", "runner._model_forward")
    _wrap(SpecDecModelRunner, "sample_tokens", "runner.sample_tokens")
    _wrap(SpecDecModelRunner, "_sample", "runner._sample")
    _wrap(SpecDecModelRunner, "propose_draft_token_ids", "runner.propose_draft_token_ids")
    import vllm.v1.attention.backends.utils  # noqa: F401  (builders are called via the runner)
    from specdec_plugin.attention import impl as attn_impl
    _wrap(attn_impl.SpecDecAttentionImpl, "forward", "fwd/attention kernel")
    _wrap(attn_impl.SpecDecAttentionImpl, "do_kv_cache_update", "fwd/kv cache write")

    engine = json.loads(args.engine)
    spec, target = None, str(fetch_smollm2())
    if args.method == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    elif args.method == "suffix":
        spec = {"method": "suffix", "num_speculative_tokens": 3}
    elif args.method != "none":  # eagle3, draft_model, ...: the side-by-side benchmark's configs
        from bench_spec_cpu import spec_configs

        target, spec = spec_configs(str(fetch_smollm2()))[args.method]
    # --engine '{"speculative_config": {...}}' replaces the method's (synthetic acceptance).
    spec = engine.pop("speculative_config", spec)
    llm = LLM(model=target, dtype=engine.pop("dtype", "float32"), max_model_len=1024,
              enable_prefix_caching=False, max_num_seqs=8, seed=0, speculative_config=spec,
              **engine)
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    _hook_modules(runner.model)
    _wrap(runner.model, "compute_logits", "fwd/logits (lm head)")
    drafter = getattr(runner, "drafter", None)
    if hasattr(drafter, "_greedy_sample"):  # EAGLE-family and draft-model proposers
        # The drafter's LM head and argmax per draft token (inside the proposer's time).
        _wrap(drafter, "_greedy_sample", "drafter greedy sample (lm head + argmax)")
    tok = llm.get_tokenizer()
    prompts = [TokensPrompt(prompt_token_ids=tok(p).input_ids) for p in PROMPTS[: args.batch]]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens,
                            min_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    TOTALS.clear()
    COUNTS.clear()
    t0 = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    steps = COUNTS["engine step"] or 1
    report = {"batch": args.batch, "method": args.method, "wall_s": wall, "steps": steps,
              "tok_per_s": args.batch * args.max_tokens / wall,
              "ms_per_step": {k: 1e3 * v / steps for k, v in sorted(TOTALS.items())}}
    print(f"batch {args.batch} method {args.method}: {wall:.2f} s, {steps} steps, "
          f"{report['tok_per_s']:.1f} tok/s, {1e3 * wall / steps:.2f} ms/step")
    for k, v in report["ms_per_step"].items():
        print(f"  {k:40s} {v:8.2f} ms/step  ({COUNTS[k] / steps:.0f} calls/step)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
