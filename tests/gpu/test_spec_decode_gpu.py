"""On an NVIDIA GPU, with graphs: every speculative method is lossless and drafts like vLLM's own.

SmolLM2-135M and our trained drafters, 32 prompts x 64 greedy tokens, engines with vLLM's
defaults (torch.compile, FULL_AND_PIECEWISE graphs, async scheduling where vLLM allows it):
- bf16: output with speculation equals output without it on >= 80% of prompts, and every
  prompt where it does not first differs at a bf16 near-tie of the target's logits
  (tests/gpu/ties.py says why a count alone was the wrong test);
- fp32: on every prompt, except where the target's top-2 logits tie (gap < 1e-4, checked with
  transformers in fp32);
- acceptance length through our plugin within 3% of vLLM's own CUDA backend (same target,
  drafter and prompts): the check that drafting and verification are right;
- graph replay equals eager execution (fp32, same tie rule); full decode graphs were captured
  at sizes n*(1+K);
- the drafter's steps replay from our graphs (spec_decode/drafter_graphs.py) for the EAGLE family
  and draft models, and drafting from them accepts what eager drafting accepts (fp32).

Each engine runs in its own process (tests/engine_runner.py), several at once on one GPU
(each gets a fixed 1 GiB KV cache, so none measures another's memory). Run on the device:

    python -m pytest -q -m gpu tests/gpu/test_spec_decode_gpu.py

``SPECDEC_GPU_REPORT=path.json`` saves every engine's result. ``SPECDEC_GPU_METHODS=draft_model``
(a comma list) starts only those methods' engines and the plain baselines, for a lease that
changed one drafter; the tests of the others skip (``_only_methods``).
"""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

from tests.gpu.ties import BF16_MIN_EQUAL, assert_equal_but_ties, assert_flips_are_near_ties
from tests.spec_configs import K

MAX_TOKENS = 64
METHODS = ["draft_model", "eagle", "eagle3", "mtp", "ngram", "suffix"]
# vLLM's own suffix decoding needs arctic-inference, which has no wheel for vLLM 0.26's pin
# (PyPI offers 0.0.1-0.0.4): no native reference for suffix.
NATIVE_METHODS = [m for m in METHODS if m != "suffix"]
# Methods whose drafter steps replay from our graphs (vLLM's V1 EagleProposer, DraftModelProposer).
GRAPHED_DRAFTERS = ["draft_model", "eagle", "eagle3", "mtp"]


def _spec(method: str) -> dict:
    from tests.spec_configs import spec_config

    return spec_config(method, "")  # K draft tokens (tests/spec_configs.py); MTP drafts 1


def _native_spec(method: str) -> dict:
    # Our "ngram" matches on the device on GPUs (vLLM's ngram_gpu path: spec_decode/ngram_device.py),
    # whose counters count every request-step that reserved draft slots as a draft, matched or
    # not; vLLM's own ngram_gpu counts the same way, its host ngram only matched steps.
    spec = _spec(method)
    return {**spec, "method": "ngram_gpu"} if method == "ngram" else spec


def _jobs(smollm2: str) -> dict[str, dict]:
    from tests.prompts_gpu import BENCH_PROMPTS

    from specdec_plugin.models.drafters import target_for

    mimo = str(target_for("mtp"))

    def job(backend, target, dtype, spec=None, **engine):
        engine = {"dtype": dtype, "max_model_len": 1024, "kv_cache_memory_bytes": 1 << 30,
                  "gpu_memory_utilization": 0.1,
                  "enable_prefix_caching": False, **engine}
        if spec is not None:
            engine["speculative_config"] = spec
        return {"backend": backend, "model": target, "engine": engine, "prompts": BENCH_PROMPTS,
                "max_tokens": MAX_TOKENS, "batches": [len(BENCH_PROMPTS)], "repeats": 1,
                "tokens": True}

    jobs = {}
    for dtype in ("bfloat16", "float32"):
        jobs[f"ours/{dtype}/none"] = job("ours", smollm2, dtype)
        jobs[f"ours/{dtype}/none-mimo"] = job("ours", mimo, dtype)
        for method in METHODS:
            target = mimo if method == "mtp" else smollm2
            jobs[f"ours/{dtype}/{method}"] = job("ours", target, dtype, _spec(method))
        # Every compile logged, not the first per kernel (test_draft_model_expansion_...).
        jobs[f"ours/{dtype}/draft_model"]["engine"]["jit_monitor_verbose"] = True
    for method in NATIVE_METHODS:
        target = mimo if method == "mtp" else smollm2
        jobs[f"native/bfloat16/{method}"] = job("native", target, "bfloat16", _native_spec(method))
    # vLLM 0.26 accepts async scheduling with the draft model when asked, but leaves it off;
    # ours turns it on by default on CUDA (spec_decode/async_default.py): this job is the
    # synchronous comparison.
    jobs["ours/float32/draft_model-sync"] = job("ours", smollm2, "float32", _spec("draft_model"),
                                                async_scheduling=False)
    # Adaptive drafting (which the test environment turns off by default) with draft lengths
    # uniform (padded: the CUDA default since session 15) and ragged (SPECDEC_UNIFORM_DRAFTS=0):
    # n-gram on the device, suffix on the host.
    for method in ("ngram", "suffix"):
        for name, uniform in (("uniform", "1"), ("ragged", "0")):
            adaptive = job("ours", smollm2, "float32", _spec(method))
            adaptive["env"] = {"SPECDEC_UNIFORM_DRAFTS": uniform, "SPECDEC_ADAPTIVE": "1"}
            jobs[f"ours/float32/{method}-{name}"] = adaptive
    # The draft model under adaptive drafting: its padded graphs at every draft length 0..K and
    # its deferred k = 0 passes (flushes replaying the padded k = 0 graph), since session 25.
    adaptive_dm = job("ours", smollm2, "float32", _spec("draft_model"))
    adaptive_dm["env"] = {"SPECDEC_ADAPTIVE": "1"}
    jobs["ours/float32/draft_model-adaptive"] = adaptive_dm
    # EAGLE-3 under adaptive drafting with its drafting costed as the padded graphs replay it
    # (SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST, opt-in since session 42).
    draft_graphs = job("ours", smollm2, "float32", _spec("eagle3"))
    draft_graphs["env"] = {"SPECDEC_ADAPTIVE": "1", "SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST": "1"}
    jobs["ours/float32/eagle3-draftgraphs"] = draft_graphs
    jobs["ours/float32/none-eager"] = job("ours", smollm2, "float32", enforce_eager=True)
    jobs["ours/float32/eagle-eager"] = job("ours", smollm2, "float32", _spec("eagle"),
                                           enforce_eager=True)
    for method in GRAPHED_DRAFTERS:
        target = mimo if method == "mtp" else smollm2
        eager_drafter = job("ours", target, "float32", _spec(method))
        eager_drafter["env"] = {"SPECDEC_DRAFTER_GRAPHS": "0"}
        jobs[f"ours/float32/{method}-eager-drafter"] = eager_drafter
    return jobs


class _Selected(dict):
    """Engine results; one left out by SPECDEC_GPU_METHODS skips the test that asks for it."""

    def __missing__(self, name):
        pytest.skip(f"{name} not started (SPECDEC_GPU_METHODS)")


def _only_methods(jobs: dict[str, dict], methods: str) -> dict[str, dict]:
    """The jobs of ``methods`` (comma list; empty: all), with the plain baselines they compare
    against (MTP's on its MiMo target)."""
    if not methods:
        return jobs
    chosen = set(methods.split(","))
    unknown = chosen - set(METHODS)
    if unknown:
        raise ValueError(f"SPECDEC_GPU_METHODS: unknown {sorted(unknown)}; expected {METHODS}")
    plain = {"none"} | ({"none-mimo"} if "mtp" in chosen else set())
    return {name: job for name, job in jobs.items()
            if name.split("/")[-1] in plain or name.split("/")[-1].split("-")[0] in chosen}


@pytest.fixture(scope="module")
def results():
    import os

    from tests.gpu.engine_jobs import run_jobs, save_report

    from specdec_plugin.models import fetch_smollm2

    smollm2 = str(fetch_smollm2())
    jobs = _only_methods(_jobs(smollm2), os.environ.get("SPECDEC_GPU_METHODS", ""))
    out = _Selected(run_jobs(jobs, "/tmp/specdec_gpu_engines.log"))
    out["_smollm2"] = smollm2
    save_report({"_smollm2": smollm2})
    return out


def _tokens(results, name):
    result = results[name]
    assert "batches" in result, f"{name} failed: {result}"
    (entry,) = result["batches"].values()
    return entry["token_ids"], entry


def _assert_equal_but_ties(results, base: str, other: str) -> None:
    from tests.prompts_gpu import BENCH_PROMPTS

    want, _ = _tokens(results, base)
    have, _ = _tokens(results, other)
    assert_equal_but_ties(results["_smollm2"], BENCH_PROMPTS, want, have,
                          f"{other} differs from {base}")


def _baseline(method: str, dtype: str) -> str:
    return f"ours/{dtype}/none-mimo" if method == "mtp" else f"ours/{dtype}/none"


@pytest.mark.parametrize("method", METHODS)
def test_bf16_greedy_equal_but_near_ties(results, method):
    from tests.prompts_gpu import BENCH_PROMPTS

    want, _ = _tokens(results, _baseline(method, "bfloat16"))
    have, entry = _tokens(results, f"ours/bfloat16/{method}")
    assert_flips_are_near_ties(results["_smollm2"], BENCH_PROMPTS, want, have, method,
                               BF16_MIN_EQUAL)
    assert entry["spec"]["accepted"] > 0, "no draft was accepted: speculation did not happen"


@pytest.mark.parametrize("method", METHODS)
def test_fp32_greedy_equal_but_ties(results, method):
    _assert_equal_but_ties(results, _baseline(method, "float32"), f"ours/float32/{method}")


@pytest.mark.parametrize("method", NATIVE_METHODS)
def test_acceptance_length_matches_native(results, method):
    _, ours = _tokens(results, f"ours/bfloat16/{method}")
    _, native = _tokens(results, f"native/bfloat16/{method}")
    assert ours["acceptance_length"] == pytest.approx(native["acceptance_length"], rel=0.03), (
        f"{method}: ours {ours['acceptance_length']:.3f} vs native {native['acceptance_length']:.3f}")


@pytest.mark.parametrize("name", ["none", "eagle"])
def test_graph_replay_equals_eager(results, name):
    assert results[f"ours/float32/{name}-eager"]["cudagraph_mode"] == "NONE"
    _assert_equal_but_ties(results, f"ours/float32/{name}-eager", f"ours/float32/{name}")


@pytest.mark.parametrize("method", ["eagle", "eagle3", "draft_model", "ngram"])
def test_full_decode_graphs_at_multiples_of_1_plus_k(results, method):
    result = results[f"ours/bfloat16/{method}"]
    assert result["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert "decode, FULL" in result["captured"], result["captured"]
    assert result["capture_sizes"] and all(s % (1 + K) == 0 for s in result["capture_sizes"])


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_async_scheduling_with_eagle_family(results, method):
    assert results[f"ours/bfloat16/{method}"]["async_scheduling"] is True


@pytest.mark.parametrize("method", GRAPHED_DRAFTERS)
def test_drafter_steps_replay_from_graphs(results, method):
    for dtype in ("bfloat16", "float32"):
        graphs = results[f"ours/{dtype}/{method}"]["drafter_graphs"]
        assert graphs["recorded"] > 0 and graphs["failed"] == 0, f"{method} {dtype}: {graphs}"
    eager = results[f"ours/float32/{method}-eager-drafter"]["drafter_graphs"]
    assert eager["recorded"] == 0, eager


@pytest.mark.parametrize("method", GRAPHED_DRAFTERS)
def test_drafter_graphs_accept_like_eager_drafting(results, method):
    # fp32: the same drafts up to rounding. The eager drafter pads its batch to vLLM's capture
    # sizes and the graph does not, so matrix products may round differently and flip a
    # near-tied draft token; acceptance must agree within 1%.
    eager_name = f"ours/float32/{method}-eager-drafter"
    _assert_equal_but_ties(results, _baseline(method, "float32"), eager_name)
    _, graphed = _tokens(results, f"ours/float32/{method}")
    _, eager = _tokens(results, eager_name)
    assert graphed["acceptance_length"] == pytest.approx(eager["acceptance_length"], rel=0.01), (
        f"{method}: drafter graphs {graphed['acceptance_length']:.4f}, "
        f"eager drafting {eager['acceptance_length']:.4f}")


# Issue 12, "no compile after start": vLLM's JIT monitor logs every Triton compile once the
# engine serves. Until session 13 each of these engines compiled the all-greedy rejection
# kernel and (EAGLE family) the padded input-preparation kernels at its first request; start-up
# now launches them (worker/kernel_warmup.py). The draft model compiled four kernels while
# serving (session 24); with its drafter batches padded and their graphs recorded at start-up
# (session 25) one attention variant was left, in bf16 and fp32 alike, in its eager (prefill)
# passes. Session 26 found it with SPECDEC_LOG_TRITON_COMPILES=1: the largest query tile
# unsplit, over 3 query heads and 3 KV heads (no grouping). The warm-up planned that launch as
# an ordinary one, and a 128-token query over so few KV heads splits, so only the split variant
# was compiled at start (worker/kernel_warmup.py now plans it host-bound, unsplit;
# tests/test_kernel_warmup.py covers ungrouped heads); session 27's run passed with it.
# Suffix engines compiled split attention variants while serving in session 25 (split buffers
# off 16-byte alignment, c6ec4cb); none in session 26's run (both dtypes): covered too.
@pytest.mark.parametrize("method", ["draft_model", "eagle", "eagle3", "mtp", "ngram", "suffix"])
def test_no_kernel_compiles_after_start(results, method):
    for dtype in ("bfloat16", "float32"):
        late = results[f"ours/{dtype}/{method}"]["jit_events"]
        assert not late, f"{method} {dtype} compiled while serving: {late}"
        # torch.compile'd functions too: vLLM's async computed-token correction recompiled
        # for one-request batches (0.3-1.0 s stalls, session 27; patch P14).
        again = results[f"ours/{dtype}/{method}"].get("dynamo_recompiles")
        assert again == [], f"{method} {dtype} recompiled while serving: {again}"


def test_draft_model_with_async_scheduling(results):
    """The draft model runs under async scheduling by default on CUDA (vLLM's default is off;
    spec_decode/async_default.py): lossless, and accepting as without it. With every draft
    rejected it cost 1.22-1.36x of plain decoding without, 1.00-1.03x with (H100,
    BENCHMARKS.md, session 14)."""
    name = "ours/float32/draft_model"
    for dtype in ("bfloat16", "float32"):
        assert results[f"ours/{dtype}/draft_model"]["async_scheduling"] is True
    assert results["ours/float32/draft_model-sync"]["async_scheduling"] is False
    _assert_equal_but_ties(results, "ours/float32/none", name)
    _, with_async = _tokens(results, name)
    _, without = _tokens(results, "ours/float32/draft_model-sync")
    assert with_async["acceptance_length"] == pytest.approx(without["acceptance_length"], rel=0.02)


@pytest.mark.parametrize("method", ["ngram", "suffix"])
@pytest.mark.parametrize("lengths", ["uniform", "ragged"])
def test_adaptive_drafts_are_lossless(results, method, lengths):
    """Adaptive drafting, drafts padded to one length (adaptive/uniform_drafts.py: filler
    verified in full graphs) or left ragged (piecewise graphs): the output is the target's."""
    _assert_equal_but_ties(results, "ours/float32/none", f"ours/float32/{method}-{lengths}")


def test_adaptive_draft_model_replays_padded_graphs_losslessly(results):
    """Adaptive drafting asks the draft model for every length 0..K: each has padded graphs
    recorded at start-up (more than the K-only engine's), none recorded while serving, and the
    output is plain decoding's (fp32, ties aside)."""
    name = "ours/float32/draft_model-adaptive"
    graphs = results[name]["drafter_graphs"]
    static = results["ours/float32/draft_model"]["drafter_graphs"]
    assert graphs["failed"] == 0 and graphs["recorded_while_serving"] == 0, graphs
    assert graphs["recorded"] > static["recorded"], (graphs, static)
    _assert_equal_but_ties(results, "ours/float32/none", name)


def test_draft_model_expansion_kernel_compiles_once(results):
    """The draft model's input-expansion kernel compiled four variants while one engine served
    batches 1, 16 and 64 (H100, session 13): its token counts were specialised (1, multiples
    of 16, other). They no longer are, so it compiles once (at the first request: it is not in
    the start-up warm-up yet). The draft-model jobs log every compile (jit_monitor_verbose)."""
    for dtype in ("bfloat16", "float32"):
        expand = [e for e in results[f"ours/{dtype}/draft_model"]["jit_events"]
                  if e["kernel"] == "_eagle_expand_kernel"]
        assert len(expand) <= 1, f"draft_model {dtype}: {expand}"


def test_drafting_timed_as_its_graphs_at_start_and_lossless(results):
    """SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST=1: the start-up table times each draft length's padded
    drafter graph at every padded batch size (adaptive/measure.py), each length's times
    non-decreasing with the batch, and the output stays plain decoding's."""
    import re

    name = "ours/float32/eagle3-draftgraphs"
    lines = [line for line in results[name]["controller_log"]
             if "drafter graphs timed, " in line]
    k = _spec("eagle3")["num_speculative_tokens"]
    assert [int(re.search(r", (\d+) drafts", line).group(1)) for line in lines] == list(
        range(1, k + 1)), results[name]["controller_log"][:k + 2]
    for line in lines:
        times = [float(ms) for ms in re.findall(r" \d+:([\d.]+)", line)]
        assert times and all(t > 0 for t in times) and times == sorted(times), line
    _assert_equal_but_ties(results, "ours/float32/none", name)
