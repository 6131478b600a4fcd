"""Our plugin against vLLM's own CUDA backend, side by side in one run on one GPU.

For each speculative method (and none), the same engine configuration runs twice, each in a
fresh process: once on vLLM's own platform (``VLLM_PLUGINS=""``: FlashAttention, its kernels)
and once on ours; both with vLLM's defaults (torch.compile, CUDA graphs). Each prints ms/token
(the latency one request sees per generated token), tokens/s, acceptance length and
per-position acceptance at each batch size, and the ratio ours/native.

    python benchmarks/bench_gpu_side_by_side.py --out results/ [--model llama7b-random]
        [--methods none,draft_model,eagle,eagle3,ngram,suffix] [--batches 1,16]
        [--backends native,ours,ours-static,ours-k-padded,ours-defer,ours-nodefer,ours-async,native-async,ours-sync,
                    ours-uniform,ours-ragged,ours-suffix-async,ours-suffix-sync,ours-suffix-late,ours-suffix-early,
                    ours-observed,ours-full-inputs,ours-slow-explore,ours-fused-kv,ours-skinny,
                    ours-unpadded]

Models:
- ``llama7b-random``: the random 7.24B Llama of ../shared/notes/native-baseline.md with random
  drafters (benchmarks/gpu_models.py) and synthetic acceptance (``--acceptance-length``, 3.0).
- ``smollm2-padded``: SmolLM2-135M padded to a 7B-class shape with our trained drafters padded
  to match (specdec_plugin/models/padded.py), real acceptance; needs ``--small-target`` (the
  SmolLM2 checkpoint directory) and builds the padded checkpoints under ``--work``.

Timing: each batch is generated ``--warmups`` times untimed, then ``--repeats`` times; the median
wall time of ``LLM.generate`` is reported (the engine runs its own process; the host clock
brackets complete, synchronous requests). Writes ``side_by_side.json`` after every engine (a
run cut short keeps what it measured) and ``side_by_side.png`` at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo

from tests.engine_runner import run_in_subprocess  # noqa: E402

METHODS = ("none", "draft_model", "eagle", "eagle3", "ngram", "suffix")


def _random_setup(args, family: str) -> tuple[str, dict, dict]:
    from gpu_models import FAMILIES, repeated_random_prompt, synthetic_spec_configs, write_configs

    paths = write_configs(args.work, family)
    specs = synthetic_spec_configs(paths, args.acceptance_length, args.k)
    vocab = FAMILIES[family]["target"]["vocab_size"]
    workload = {"prompt_token_ids": [repeated_random_prompt(vocab=vocab, seed=s) for s in range(16)],
                "engine": {"load_format": "dummy", "skip_tokenizer_init": True}}
    return paths["target"], specs, workload


def suffix_cache_setting(max_cached_requests: int) -> dict:
    """Timed runs repeat the warm-up's prompts, so suffix's cache of finished requests would
    hold each answer before it is timed (session 42 left the setting out by mistake, and
    suffix accepted 4.2-4.9 of 5 tokens on prose): 0, the default, measures drafting from the
    request alone; a negative value keeps vLLM's own cache size."""
    if max_cached_requests < 0:
        return {}
    return {"suffix_decoding_max_cached_requests": max_cached_requests}


def _padded_setup(args) -> tuple[str, dict, dict]:
    from specdec_plugin.models.padded import build_padded_checkpoints, padded_speculative_config

    paths = build_padded_checkpoints(args.work, args.small_target, device="cuda")
    specs = {"none": None}
    for method in ("draft_model", "eagle", "eagle3"):
        if method in paths:
            specs[method] = padded_speculative_config(method, paths[method], args.k)
    specs["ngram"] = {"method": "ngram", "num_speculative_tokens": args.k,
                      "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    specs["suffix"] = {"method": "suffix", "num_speculative_tokens": args.k}
    specs["suffix"].update(suffix_cache_setting(args.suffix_max_cached_requests))
    if args.workloads:
        from real_workloads import WORKLOADS

        chosen = {name: WORKLOADS[name] for name in args.workloads.split(",")}
        return str(paths["target"]), specs, {"workloads": chosen, "engine": {}}
    from tests.prompts_gpu import BENCH_PROMPTS

    return str(paths["target"]), specs, {"prompts": BENCH_PROMPTS, "engine": {}}


SETUPS = {
    "llama7b-random": lambda args: _random_setup(args, "llama7b"),
    # Llama-3.1-70B's layers, 40 of them (36B): for --tensor-parallel-size 2 on two GPUs.
    "llama70b-40l-random": lambda args: _random_setup(args, "llama70b-40l"),
    "smollm2-padded": _padded_setup,
}


def add_setup_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments every entry of SETUPS reads (also used by profile_engine.py)."""
    parser.add_argument("--work", default="/tmp/specdec_bench_models")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--acceptance-length", type=float, default=3.0)
    parser.add_argument("--workloads", help="smollm2-padded only: comma list of "
                        "benchmarks/real_workloads.py names (prose, code_edit), each timed in "
                        "the same engine; default: the GPU tests' 32 mixed prompts")
    parser.add_argument("--suffix-max-cached-requests", type=int, default=0,
                        help="smollm2-padded: suffix_decoding_max_cached_requests (default 0: no "
                             "cache of finished requests, whose answers the warm-up would put "
                             "there; negative: vLLM's own default)")


# What each --backends entry runs: the engine_runner backend, extra environment, extra
# ``LLM(...)`` arguments, and the methods it applies to (None: all). The variants of ours
# change only how drafting runs, so they have nothing to compare for some methods.
class Backend(NamedTuple):
    runner: str
    label: str
    env: dict = {}
    engine: dict = {}
    methods: frozenset | None = None


_DRAFTING = frozenset({"draft_model", "eagle", "eagle3", "ngram", "suffix"})
BACKENDS = {
    # vLLM's suffix decoding needs arctic-inference, which the device kit lacks: its engine
    # only fails to start (about 20 s of a lease, session 58). The issue compares suffix with
    # native n-gram instead.
    "native": Backend("native", "vLLM native",
                      methods=frozenset({"none", "mtp"}) | _DRAFTING - {"suffix"}),
    "ours": Backend("ours", "specdec_plugin"),  # adaptive drafting on, as users get it
    # K drafts every step, as vLLM does.
    "ours-static": Backend("ours", "specdec_plugin, K every step", {"SPECDEC_ADAPTIVE": "0"},
                           methods=_DRAFTING),
    # K drafts every step through our scheduler (SPECDEC_ADAPTIVE_LENGTHS; K = 4, the default
    # --k: another K fails at engine start, naming the variable): n-gram and suffix drafts keep
    # their padded lengths and full graphs, which "ours-static" turns off with the controller.
    "ours-k-padded": Backend("ours", "specdec_plugin, K every step, padded",
                             {"SPECDEC_ADAPTIVE_LENGTHS": "4"}, methods=_DRAFTING),
    # vLLM's per-step input ids and index uploads for uniform steps too (issue 12, session
    # 61: the default keeps them on the device, worker/uniform_step_inputs.py).
    "ours-full-inputs": Backend("ours", "specdec_plugin, vLLM's per-step input uploads",
                                {"SPECDEC_LEAN_STEP_INPUTS": "0"}, methods=_DRAFTING),
    # Each layer's new K/V written inside its attention launch (issue 12, session 62:
    # ops/paged_attention paged_attention_write_kv), every method and plain decoding.
    "ours-fused-kv": Backend("ours", "specdec_plugin, KV write fused into attention",
                             {"SPECDEC_FUSED_KV_WRITE": "1"}),
    # Products of at most 16 token rows through our skinny GEMM instead of cuBLAS (issue 12,
    # session 64: ops/skinny_gemm, patch P16).
    "ours-skinny": Backend("ours", "specdec_plugin, skinny GEMM for few rows",
                           {"SPECDEC_SKINNY_GEMM": "1"}),
    # Deeper drafts that missed retried less often (issue 12, session 62: at synthetic 3.0
    # EAGLE-3 drafted 3-4 in 21% of its batch-1 steps; adaptive/acceptance.py).
    "ours-slow-explore": Backend("ours", "specdec_plugin, untested positions fade slowly",
                                 {"SPECDEC_ADAPTIVE_UNTESTED_DECAY": "0.99"},
                                 methods=_DRAFTING),
    # The two opt-ins above together: what issue 12's bar would see if both became defaults.
    "ours-skinny-slow": Backend("ours", "specdec_plugin, skinny GEMM + slow fading",
                                {"SPECDEC_SKINNY_GEMM": "1",
                                 "SPECDEC_ADAPTIVE_UNTESTED_DECAY": "0.99"},
                                methods=_DRAFTING),
    # The drafter's KV sync deferred over plain steps (issue 11; the CUDA default since
    # session 13, so "ours" has it too unless the environment sets it to 0).
    "ours-defer": Backend("ours", "specdec_plugin, drafter sync deferred",
                          {"SPECDEC_DEFER_DRAFTER_SYNC": "1"},
                          methods=frozenset({"eagle", "eagle3"})),
    "ours-nodefer": Backend("ours", "specdec_plugin, drafter sync every step",
                            {"SPECDEC_DEFER_DRAFTER_SYNC": "0"},
                            methods=frozenset({"eagle", "eagle3"})),
    # vLLM 0.26 leaves async scheduling off by default for the draft model but accepts it when
    # asked (config/vllm.py): measured against the default, each side, before either platform
    # turns it on for users.
    "ours-async": Backend("ours", "specdec_plugin, async scheduling",
                          engine={"async_scheduling": True}, methods=frozenset({"draft_model"})),
    "native-async": Backend("native", "vLLM native, async scheduling",
                            engine={"async_scheduling": True}, methods=frozenset({"draft_model"})),
    # n-gram and suffix drafts padded to the step's length (adaptive/uniform_drafts.py):
    # uniform decode batches, full graphs. The CUDA default since session 15 (so "ours" has it
    # there); "ours-ragged" is the comparison.
    "ours-uniform": Backend("ours", "specdec_plugin, uniform draft lengths",
                            {"SPECDEC_UNIFORM_DRAFTS": "1"},
                            methods=frozenset({"ngram", "suffix"})),
    "ours-ragged": Backend("ours", "specdec_plugin, ragged draft lengths",
                           {"SPECDEC_UNIFORM_DRAFTS": "0"},
                           methods=frozenset({"ngram", "suffix"})),
    # The adaptive controller's start-up step costs corrected by observed step times
    # (adaptive/observed_cost.py): for every method ("ours" on CUDA: suffix only, since
    # session 24), and for none (the start-up table alone, the default before).
    "ours-observed": Backend("ours", "specdec_plugin, observed step costs",
                             {"SPECDEC_ADAPTIVE_OBSERVED_COST": "1"}, methods=_DRAFTING),
    "ours-table": Backend("ours", "specdec_plugin, start-up step costs only",
                          {"SPECDEC_ADAPTIVE_OBSERVED_COST": "0"}, methods=_DRAFTING),
    # The correction from the interquartile mean of recent ratios instead of their median,
    # for suffix (the method the CUDA default corrects).
    "ours-observed-iqm": Backend("ours", "specdec_plugin, observed step costs (iqm)",
                                 {"SPECDEC_ADAPTIVE_OBSERVED_ESTIMATOR": "iqm"},
                                 methods=frozenset({"suffix"})),
    # The adaptive controller without its hysteresis (SPECDEC_ADAPTIVE_RESUME_GAIN=0, the rule
    # before session 16): drafting resumes at the same 3% predicted gain that keeps it on.
    "ours-resume0": Backend("ours", "specdec_plugin, no resume margin",
                            {"SPECDEC_ADAPTIVE_RESUME_GAIN": "0"}, methods=_DRAFTING),
    # Drafting that may not slow the least accepting quarter of the batch (adaptive/policy.py,
    # SPECDEC_ADAPTIVE_PROTECT): opt-in until measured here.
    "ours-protect": Backend("ours", "specdec_plugin, slowest quarter protected",
                            {"SPECDEC_ADAPTIVE_PROTECT": "0.25"}, methods=_DRAFTING),
    # Opt-in controller variants to measure before either becomes a default (session 37):
    # a drafting length held until another promises 3% more (adaptive/policy.py), and the
    # start-up table timed at every draft length's token counts (adaptive/measure.py).
    "ours-hold": Backend("ours", "specdec_plugin, draft length held",
                         {"SPECDEC_ADAPTIVE_SWITCH_GAIN": "0.03"}, methods=_DRAFTING),
    "ours-lengths": Backend("ours", "specdec_plugin, table at every draft length",
                            {"SPECDEC_ADAPTIVE_TABLE_LENGTHS": "1"}, methods=_DRAFTING),
    # The table interpolated between n and n*(1+K) tokens, as before session 40 made every
    # length's timing the CUDA default for EAGLE-3: "ours-lengths" against this, per method.
    "ours-interp": Backend("ours", "specdec_plugin, table interpolated between lengths",
                           {"SPECDEC_ADAPTIVE_TABLE_LENGTHS": "0"}, methods=_DRAFTING),
    # Drafting costed at start-up as the padded drafter graph each length replays, not one
    # dummy_run pass per token (SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST; session 42's prose batch-1
    # miss): opt-in; no better in session 43.
    "ours-draftgraphs": Backend("ours", "specdec_plugin, drafting timed as its graphs",
                                {"SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST": "1"},
                                methods=frozenset({"draft_model", "eagle", "eagle3"})),
    # No 3% margin between drafting lengths (SPECDEC_ADAPTIVE_LENGTH_GAIN=0, adaptive/policy.py;
    # session 42: prose at batch 1 drafted 3 where 4 was about 2.6% better), alone and with
    # drafting timed as its graphs. EAGLE-3's default since session 43 (adaptive/config.py
    # DEFAULT_LENGTH_GAIN), so for EAGLE-3 "ours-gain0" is "ours" and "ours-gain3" the earlier
    # rule; for the other methods the other way round.
    "ours-gain0": Backend("ours", "specdec_plugin, best drafting length",
                          {"SPECDEC_ADAPTIVE_LENGTH_GAIN": "0"}, methods=_DRAFTING),
    "ours-gain3": Backend("ours", "specdec_plugin, 3% margin between drafting lengths",
                          {"SPECDEC_ADAPTIVE_LENGTH_GAIN": "0.03"}, methods=_DRAFTING),
    "ours-draftgraphs-gain0": Backend("ours", "specdec_plugin, graph-timed drafting, best length",
                                      {"SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST": "1",
                                       "SPECDEC_ADAPTIVE_LENGTH_GAIN": "0"},
                                      methods=frozenset({"draft_model", "eagle", "eagle3"})),
    # The draft model as before session 25: its drafter graphs recorded per exact batch shape
    # while serving, its pass run every step (no deferral without padded graphs).
    "ours-unpadded": Backend("ours", "specdec_plugin, draft model unpadded",
                             {"SPECDEC_DRAFTER_PADDING": "0"},
                             methods=frozenset({"draft_model"})),
    # EAGLE-family prefix-cache hits recomputing their last block, as vLLM does (ours keeps
    # it since session 26: spec_decode/drafter_prefix_cache.py). The benchmark's timed runs
    # repeat the warm-up's prompts, so every request of a timed run hits the prefix cache.
    "ours-recompute-block": Backend("ours", "specdec_plugin, hit's last block recomputed",
                                    {"SPECDEC_RECOMPUTE_DRAFTER_BLOCK": "1"},
                                    methods=frozenset({"eagle", "eagle3", "mtp"})),
    # What async scheduling is worth to plain decoding: the methods that run without it
    # (suffix, draft model by default) pay at most this.
    "ours-sync": Backend("ours", "specdec_plugin, async scheduling off",
                         engine={"async_scheduling": False}, methods=frozenset({"none"})),
    # Suffix decoding under async scheduling, drafts made lazily (SPECDEC_SUFFIX_ASYNC,
    # spec_decode/suffix_lazy.py): "ours" on CUDA since session 22; these two name each side.
    "ours-suffix-async": Backend("ours", "specdec_plugin, suffix under async scheduling",
                                 env={"SPECDEC_SUFFIX_ASYNC": "1"}, methods=frozenset({"suffix"})),
    "ours-suffix-sync": Backend("ours", "specdec_plugin, suffix with synchronous scheduling",
                                env={"SPECDEC_SUFFIX_ASYNC": "0"}, methods=frozenset({"suffix"})),
    # Suffix drafts written into the prepared step just before its forward pass instead of
    # waited for before its preparation (spec_decode/suffix_async_runner.py; session 55):
    # "ours" on CUDA since session 58's H200 run; these two name each side.
    "ours-suffix-late": Backend("ours", "specdec_plugin, suffix drafts written late",
                                env={"SPECDEC_SUFFIX_LATE_DRAFTS": "1"},
                                methods=frozenset({"suffix"})),
    "ours-suffix-early": Backend("ours", "specdec_plugin, suffix drafts before preparation",
                                 env={"SPECDEC_SUFFIX_LATE_DRAFTS": "0"},
                                 methods=frozenset({"suffix"})),
}
_COLUMNS = [name.replace("-", "_") for name in BACKENDS]  # their keys in the JSON rows


def _job(backend: str, target: str, spec: dict | None, workload: dict, args) -> dict:
    engine = {"dtype": "bfloat16", "max_model_len": args.max_model_len,
              "max_num_seqs": max(args.batches), "gpu_memory_utilization": 0.85,
              "tensor_parallel_size": args.tensor_parallel_size,
              **workload["engine"]}
    if spec is not None:
        engine["speculative_config"] = spec
    if args.jit_verbose:
        engine["jit_monitor_verbose"] = True  # log every Triton compile, not one per kernel
    runner_backend, _, env, overrides, _ = BACKENDS[backend]
    engine.update(overrides)
    job = {"backend": runner_backend, "model": target, "engine": engine,
           "max_tokens": args.max_tokens, "batches": args.batches, "repeats": args.repeats,
           "warmups": args.warmups, "env": dict(env),
           "batch1_prompts": args.batch1_prompts, "cell_prompts": args.cell_prompts}
    job.update({k: v for k, v in workload.items()
                if k in ("prompts", "prompt_token_ids", "workloads")})
    if backend == "native" and args.native_runner == "v1":
        job["env"]["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    return job


def _row(method: str, cell: str, results: dict[str, dict]) -> dict:
    """``cell``: the engine runner's key, "batch" or "workload:batch"."""
    workload, _, batch = cell.rpartition(":")
    row = {"method": method, "batch": int(batch)}
    if workload:
        row["workload"] = workload
    for backend, result in results.items():
        name = backend.replace("-", "_")
        entry = result.get("batches", {}).get(cell, {})
        row[f"{name}_ms_per_token"] = entry.get("ms_per_token")
        # The decode phase alone (tests/engine_runner.py): no prefill, no call overhead.
        row[f"{name}_decode_ms_per_token"] = entry.get("decode_ms_per_token")
        row[f"{name}_tokens_per_s"] = entry.get("tokens_per_s")
        # Where the time before the decode phase went: hand-over, prefills (engine_runner).
        row[f"{name}_start_phase_ms"] = entry.get("start_phase_ms")
        row[f"{name}_acceptance_length"] = entry.get("acceptance_length")
        row[f"{name}_acceptance_per_position"] = entry.get("acceptance_per_position")
        # Among the drafts that reached each position (tests/engine_runner.py); ours only.
        row[f"{name}_acceptance_per_reached_position"] = entry.get(
            "acceptance_per_reached_position")
    if row.get("native_ms_per_token") and row.get("ours_ms_per_token"):
        row["ratio_ms_per_token"] = row["ours_ms_per_token"] / row["native_ms_per_token"]
    if row.get("ours_static_ms_per_token") and row.get("ours_ms_per_token"):
        row["ratio_adaptive_vs_static"] = row["ours_ms_per_token"] / row["ours_static_ms_per_token"]
    return row


def _our_plain(rows: list[dict], metric: str) -> dict:
    """Our no-speculation ``metric`` by cell (workload, batch)."""
    return {(r.get("workload"), r["batch"]): r.get(f"ours_{metric}")
            for r in rows if r["method"] == "none"}


def _add_ratios_to_plain(rows: list[dict]) -> None:
    """ms/token of each speculative row over our own no-speculation row at the same batch
    (issue 11's bar: speculation that never costs), and the same for the decode phase alone."""
    for metric, suffix in (("ms_per_token", "vs_our_plain"),
                           ("decode_ms_per_token", "decode_vs_our_plain")):
        plain = _our_plain(rows, metric)
        for r in rows:
            for name in _COLUMNS:
                value = r.get(f"{name}_{metric}")
                base = plain.get((r.get("workload"), r["batch"]))
                if value and base:
                    r[f"{name}_{suffix}"] = value / base


# Issue 11's real-prompt bar: the adaptive engine at least 0.97x the speed of the better of
# plain decoding and K every step, i.e. at most 1/0.97 of the better one's ms/token.
BAR_VS_BEST = 1 / 0.97


def _add_ratios_to_best(rows: list[dict]) -> None:
    """Each speculative row's ms/token over the better of our plain decoding and our K every
    step (``ours_static``) at the same cell, for every backend of the row: ``<name>_vs_best``,
    and ``<name>_decode_vs_best`` for the decode phase alone. Rows without both are left
    alone."""
    for metric, suffix in (("ms_per_token", "vs_best"), ("decode_ms_per_token", "decode_vs_best")):
        plain = _our_plain(rows, metric)
        for r in rows:
            base, static = plain.get((r.get("workload"), r["batch"])), r.get(f"ours_static_{metric}")
            if r["method"] == "none" or not base or not static:
                continue
            best = min(base, static)
            for name in _COLUMNS:
                value = r.get(f"{name}_{metric}")
                if value:
                    r[f"{name}_{suffix}"] = value / best


def _print_bar(rows: list[dict]) -> None:
    """Issue 11's bar per cell: every backend against the better of plain and K every step
    (ms/token, and in brackets the decode phase's); * marks a miss."""
    for r in rows:
        names = [n for n in _COLUMNS if r.get(f"{n}_vs_best") and n != "ours_static"]
        if not names:
            continue
        cell = f"{r['workload']}:{r['batch']}" if "workload" in r else str(r["batch"])
        parts = []
        for n in names:
            ratio, decode = r[f"{n}_vs_best"], r.get(f"{n}_decode_vs_best")
            mark = "*" if ratio > BAR_VS_BEST else ""
            parts.append(f"{n} {ratio:.3f}{mark}" + (f" ({decode:.3f})" if decode else ""))
        print(f"bar <= {BAR_VS_BEST:.4f}  {r['method']} {cell}: " + ", ".join(parts))


def _print_table(rows: list[dict]) -> None:
    def fmt(value, spec=".2f"):
        return "-" if value is None else format(value, spec)

    print(f"{'method':<12}{'batch':>13}{'native ms/tok':>15}{'ours ms/tok':>13}{'ratio':>8}"
          f"{'static ms/tok':>15}{'vs plain':>10}{'defer ms/tok':>14}{'vs plain':>10}"
          f"{'native AL':>11}{'ours AL':>9}{'decode vs plain':>17}")
    for r in rows:
        cell = f"{r['workload']}:{r['batch']}" if "workload" in r else str(r["batch"])
        print(f"{r['method']:<12}{cell:>13}{fmt(r.get('native_ms_per_token')):>15}"
              f"{fmt(r.get('ours_ms_per_token')):>13}{fmt(r.get('ratio_ms_per_token'), '.3f'):>8}"
              f"{fmt(r.get('ours_static_ms_per_token')):>15}{fmt(r.get('ours_vs_our_plain'), '.3f'):>10}"
              f"{fmt(r.get('ours_defer_ms_per_token')):>14}{fmt(r.get('ours_defer_vs_our_plain'), '.3f'):>10}"
              f"{fmt(r.get('native_acceptance_length')):>11}{fmt(r.get('ours_acceptance_length')):>9}"
              f"{fmt(r.get('ours_decode_vs_our_plain'), '.3f'):>17}")


def _chart(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 4), squeeze=False)
    for ax, batch in zip(axes[0], batches):
        sub = [r for r in rows if r["batch"] == batch]
        x = range(len(sub))
        series = [(name, backend.label) for name, backend in zip(_COLUMNS, BACKENDS.values())
                  if any(f"{name}_ms_per_token" in r for r in sub)]
        width = 0.8 / len(series)
        for j, (name, label) in enumerate(series):
            ax.bar([i - 0.4 + width * (j + 0.5) for i in x],
                   [r.get(f"{name}_ms_per_token") or 0 for r in sub], width, label=label)
        ax.set_xticks(list(x), [r["method"] for r in sub], rotation=20)
        ax.set_ylabel("ms per token (lower is better)")
        ax.set_title(f"batch {batch}")
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _speedup_chart(rows: list[dict], path: Path, title: str) -> None:
    """Speedup over our own plain decoding against batch size: one panel per workload, one
    line per method and backend (issue 11's batch sweep)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({r.get("workload", "") for r in rows})
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4.5), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        sub = [r for r in rows if r.get("workload", "") == workload and r["method"] != "none"]
        for method in sorted({r["method"] for r in sub}):
            for name, backend in zip(_COLUMNS, BACKENDS.values()):
                points = sorted((r["batch"], 1.0 / r[f"{name}_vs_our_plain"]) for r in sub
                                if r["method"] == method and r.get(f"{name}_vs_our_plain"))
                if points:
                    ax.plot(*zip(*points), marker="o", label=f"{method}: {backend.label}")
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch (requests)")
        ax.set_ylabel("speedup over our plain decoding")
        ax.set_title(workload or "all prompts")
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    add_setup_arguments(parser)
    parser.add_argument("--model", choices=sorted(SETUPS), default="llama7b-random")
    parser.add_argument("--small-target", help="SmolLM2 checkpoint directory (smollm2-padded)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="GPUs per engine (both backends; vLLM's NCCL process groups)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--batch1-prompts", type=int, default=1,
                        help="time batch 1 over this many prompts, one request after another "
                             "in each run (default 1: the first prompt alone)")
    parser.add_argument("--cell-prompts", type=int, default=0,
                        help="time every batch size b below this many prompts over them: "
                             "ceil(N/b) rounds of b requests in each run (default 0: one round "
                             "of b; batch 1 then follows --batch1-prompts)")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmups", type=int, default=2)
    parser.add_argument("--native-runner", choices=("default", "v1"), default="default",
                        help="native's model runner: vLLM's default (V2 for plain and EAGLE "
                             "decoding in 0.26, drafter in full graphs) or V1, the runner our "
                             "platform uses (drafter in piecewise graphs): v1 compares kernels "
                             "and launches on the same runner")
    parser.add_argument("--backends", default="native,ours",
                        help="comma list of " + ", ".join(BACKENDS) + " (ours-static: our plugin "
                             "with adaptive drafting off, SPECDEC_ADAPTIVE=0; ours-defer: the drafter's "
                             "KV sync deferred, SPECDEC_DEFER_DRAFTER_SYNC=1, ours-nodefer =0; ours-async, "
                             "native-async: draft model with async_scheduling=True; ours-sync: plain "
                             "decoding with async scheduling off; ours-uniform / ours-ragged: n-gram "
                             "and suffix with SPECDEC_UNIFORM_DRAFTS=1 / 0; ours-suffix-async: "
                             "suffix decoding under async scheduling, SPECDEC_SUFFIX_ASYNC=1 (the CUDA "
                             "default); ours-suffix-sync: SPECDEC_SUFFIX_ASYNC=0; ours-suffix-late: "
                             "SPECDEC_SUFFIX_LATE_DRAFTS=1 (the CUDA default); ours-suffix-early: =0; "
                             "ours-observed / ours-table: SPECDEC_ADAPTIVE_OBSERVED_COST=1 / 0; ours-observed-iqm: "
                             "SPECDEC_ADAPTIVE_OBSERVED_ESTIMATOR=iqm; ours-resume0: "
                             "SPECDEC_ADAPTIVE_RESUME_GAIN=0; ours-protect: "
                             "SPECDEC_ADAPTIVE_PROTECT=0.25; ours-hold: "
                             "SPECDEC_ADAPTIVE_SWITCH_GAIN=0.03; ours-lengths: "
                             "SPECDEC_ADAPTIVE_TABLE_LENGTHS=1, ours-interp =0; ours-draftgraphs: "
                             "SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST=1; ours-gain0: "
                             "SPECDEC_ADAPTIVE_LENGTH_GAIN=0, ours-gain3 =0.03; "
                             "ours-draftgraphs-gain0: both; "
                             "ours-unpadded: "
                             "SPECDEC_DRAFTER_PADDING=0, draft model; ours-k-padded: "
                             "SPECDEC_ADAPTIVE_LENGTHS=4, K every step through our scheduler; "
                             "ours-full-inputs: SPECDEC_LEAN_STEP_INPUTS=0; "
                             "ours-slow-explore: SPECDEC_ADAPTIVE_UNTESTED_DECAY=0.99; "
                             "ours-fused-kv: SPECDEC_FUSED_KV_WRITE=1; "
                             "ours-skinny: SPECDEC_SKINNY_GEMM=1)")
    parser.add_argument("--jit-verbose", action="store_true",
                        help="log every kernel compile during inference (JSON: jit_events, "
                             "run_clock_windows) to tell a slow timed run's cause")
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    target, specs, workload = SETUPS[args.model](args)
    report = {"model": args.model, "k": args.k, "batches": args.batches,
              "max_tokens": args.max_tokens, "repeats": args.repeats,
              "warmups": args.warmups, "batch1_prompts": args.batch1_prompts,
              "cell_prompts": args.cell_prompts,
              "acceptance_length_setting": args.acceptance_length if args.model.endswith("-random") else None,
              "tensor_parallel_size": args.tensor_parallel_size,
              "native_runner": args.native_runner,
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "engines": {}, "rows": []}
    log = str(out / "engines.log")
    cells = [str(b) for b in args.batches]
    if "workloads" in workload:
        cells = [f"{w}:{b}" for w in workload["workloads"] for b in args.batches]
    finished_rows: list[dict] = []  # the rows of the methods whose engines have all run
    for method in args.methods.split(","):
        results = {}
        backends = args.backends.split(",")
        for backend in (b for b in backends
                        if BACKENDS[b].methods is None or method in BACKENDS[b].methods):
            job = _job(backend, target, specs[method], workload, args)
            t0 = time.perf_counter()
            results[backend] = run_in_subprocess(job, log_path=log)
            results[backend]["run_s"] = round(time.perf_counter() - t0, 1)
            report["engines"][f"{method}/{backend}"] = results[backend]
            summary = {k: v for k, v in results[backend].items()
                       if k not in ("batches", "controller_log")}
            print(f"[{time.strftime('%H:%M:%S')}] {method}/{backend}: {json.dumps(summary)}",
                  flush=True)
            # Rows after every engine, not only after a method's last: a lease that ends
            # mid-method still leaves the finished engines' rows and ratios (session 58's
            # EAGLE-3 rows had to be rebuilt by hand from a cut run).
            report["rows"] = finished_rows + [_row(method, cell, results) for cell in cells]
            _add_ratios_to_plain(report["rows"])
            _add_ratios_to_best(report["rows"])
            (out / "side_by_side.json").write_text(json.dumps(report, indent=1))
        finished_rows = report["rows"]
    _print_table(report["rows"])
    _print_bar(report["rows"])
    title = f"{args.model}, K={args.k}, {args.max_tokens} output tokens"
    _chart(report["rows"], out / "side_by_side.png", title)
    # The speedup is over our plain decoding: without a `none` row there is nothing to draw
    # (session 53's EAGLE-3-only run wrote an empty chart).
    if len(args.batches) > 2 and any(r["method"] == "none" for r in report["rows"]):
        _speedup_chart(report["rows"], out / "speedup_vs_batch.png", title)


if __name__ == "__main__":
    main()
