"""benchmarks/bench_paired_plain.py: a speculative engine and a plain one timed in turn, on
real SmolLM2 engines (CPU): the runs alternate, the paired ratios are the run-by-run ratios,
and greedy outputs match (fp32)."""
from __future__ import annotations

import random
import statistics

import pytest

from tests.benchmark_scripts import load_benchmark
from tests.prompts import SPEC_PROMPTS
from tests.spec_configs import spec_config


@pytest.fixture(scope="module")
def paired():
    return load_benchmark("bench_paired_plain")


def _random_runs(low: float, high: float) -> tuple[list[float], list[float]]:
    """1-8 runs' figures for the method and for plain decoding, fresh each time."""
    rng = random.Random()
    n = rng.randrange(1, 9)
    return [rng.uniform(low, high) for _ in range(n)], [rng.uniform(low, high) for _ in range(n)]


def test_paired_ratios_are_run_by_run(paired):
    method, plain = _random_runs(0.5, 1.5)  # wall seconds
    got = paired.paired_ratios(method, plain)
    assert got["paired_ratios"] == pytest.approx([m / p for m, p in zip(method, plain)])
    assert got["paired_ratio"] == pytest.approx(statistics.median(got["paired_ratios"]))
    assert got["ratio_of_medians"] == pytest.approx(statistics.median(method) / statistics.median(plain))
    low, high = got["paired_ratio_ci95"]
    ratios = got["paired_ratios"]
    assert min(ratios) <= low <= got["paired_ratio"] <= high <= max(ratios)


def test_decode_pairing_pairs_the_decode_figures_run_by_run(paired):
    method, plain = _random_runs(4.0, 6.0)  # decode ms per token
    n = len(plain)
    got = paired.decode_pairing(method, plain)
    ratios = [m / p for m, p in zip(method, plain)]
    assert got["decode_paired_ratio"] == pytest.approx(statistics.median(ratios))
    low, high = got["decode_paired_ratio_ci95"]
    assert min(ratios) <= low <= got["decode_paired_ratio"] <= high <= max(ratios)
    # A run without a decode figure (no timestamps) leaves the pairing out.
    gap = random.randrange(n)
    assert paired.decode_pairing(method, plain[:gap] + [None] + plain[gap + 1:]) == {}
    assert paired.decode_pairing(method[:gap] + [None] + method[gap + 1:], plain) == {}


def test_run_start_pairing_is_the_wall_less_the_decode_phase_run_by_run(paired):
    method_walls, plain_walls = _random_runs(0.5, 0.8)  # wall seconds
    n = len(plain_walls)
    method_decode, plain_decode = [random.uniform(4.0, 5.0) for _ in range(n)], \
        [random.uniform(4.0, 5.0) for _ in range(n)]  # decode ms per token
    steps = random.randrange(16, 128)
    got = paired.run_start_pairing(method_walls, method_decode, plain_walls, plain_decode, steps)
    method = [1000 * w - steps * d for w, d in zip(method_walls, method_decode)]
    plain = [1000 * w - steps * d for w, d in zip(plain_walls, plain_decode)]
    assert got["run_start_ms"] == pytest.approx(
        {"speculative": statistics.median(method), "plain": statistics.median(plain)})
    diffs = [m - p for m, p in zip(method, plain)]
    assert got["run_start_paired_diff_ms"] == pytest.approx(statistics.median(diffs))
    low, high = got["run_start_paired_diff_ms_ci95"]
    assert min(diffs) <= low <= got["run_start_paired_diff_ms"] <= high <= max(diffs)
    gap = random.randrange(n)
    assert paired.run_start_pairing(method_walls, method_decode, plain_walls,
                                    plain_decode[:gap] + [None] + plain_decode[gap + 1:],
                                    steps) == {}


def test_bootstrap_interval_narrows_with_agreeing_pairs(paired):
    rng = random.Random()
    centre = rng.uniform(0.9, 1.1)
    same = [centre] * rng.randrange(2, 9)
    assert paired.bootstrap_median_ci(same) == pytest.approx([centre, centre])
    spread = [centre + rng.uniform(-0.1, 0.1) for _ in range(8)]
    low, high = paired.bootstrap_median_ci(spread)
    tight = [centre + (x - centre) / 10 for x in spread]  # the same pairs, a tenth as far out
    t_low, t_high = paired.bootstrap_median_ci(tight)
    assert t_high - t_low == pytest.approx((high - low) / 10)


def test_draft_tokens_per_request_per_run(paired):
    rng = random.Random()
    repeats, batch = rng.randrange(1, 17), rng.randrange(1, 65)
    tokens = rng.randrange(0, 4 * repeats * batch + 1)
    got = paired.drafts_per_request_run({"draft_tokens": tokens, "drafts": tokens}, repeats, batch)
    assert got == pytest.approx(tokens / (repeats * batch))
    # A plain engine has no counters; nothing is made up for it.
    assert paired.drafts_per_request_run(None, repeats, batch) is None
    assert paired.drafts_per_request_run({}, repeats, batch) is None


def test_bar_verdict(paired):
    rng = random.Random()
    bar = rng.uniform(1.0, 1.1)
    assert paired.bar_verdict([bar - 0.05, bar], bar) == "met"
    assert paired.bar_verdict([bar - 0.05, bar + 0.001], bar) == "unresolved"
    assert paired.bar_verdict([bar + 0.001, bar + 0.05], bar) == "missed"


@pytest.mark.slow
def test_time_pair_on_real_engines(paired, engines, smollm2_path, monkeypatch):
    calls = []
    plain = engines.get(smollm2_path, enable_prefix_caching=False)
    method = engines.get(smollm2_path, metrics=True, enable_prefix_caching=False,
                         disable_log_stats=False,
                         speculative_config=spec_config("ngram", smollm2_path))
    for name, llm in (("plain", plain), ("speculative", method)):
        generate = llm.generate

        def recorded(*args, _name=name, _generate=generate, **kwargs):
            calls.append(_name)
            return _generate(*args, **kwargs)

        monkeypatch.setattr(llm, "generate", recorded)
    repeats = random.randrange(3, 6)
    batch = random.randrange(1, 4)
    requests = random.sample(SPEC_PROMPTS, batch)
    cell = paired.time_pair(plain, method, requests, max_tokens=12, repeats=repeats, warmups=1)

    # One warm-up each, then P M, M P, P M, ...: every method run next to a plain run.
    expected = ["plain", "speculative"]
    for r in range(repeats):
        expected += ["plain", "speculative"] if r % 2 == 0 else ["speculative", "plain"]
    assert calls == expected
    assert "method" not in cell  # a report row's "method" is the method's name
    assert len(cell["plain"]["walls_s"]) == len(cell["speculative"]["walls_s"]) == repeats
    assert cell["paired_ratios"] == pytest.approx(
        [m / p for m, p in zip(cell["speculative"]["walls_s"], cell["plain"]["walls_s"])])
    # This plain engine keeps no timestamps (log stats off), so no decode pairing.
    assert "decode_ms_per_token_runs" not in cell["plain"] and "decode_paired_ratio" not in cell
    assert "run_start_ms" not in cell
    assert len(cell["speculative"]["decode_ms_per_token_runs"]) == repeats
    assert cell["requests"] == batch
    assert cell["equal_outputs"] == batch  # fp32 greedy: speculation changes nothing
    assert cell["draft_tokens_per_request_run"] == pytest.approx(
        cell["speculative"]["spec"]["draft_tokens"] / (repeats * batch))
    spec = cell["speculative"]["spec"]
    assert spec["draft_tokens"] > 0 and 0 <= spec["accepted"] <= spec["draft_tokens"]
    # Request-steps by draft length (our counter, offline through patch P15) agree with vLLM's
    # drafts and draft tokens, and give each position's acceptance among drafts reaching it.
    lengths = spec["lengths"]
    assert sum(n for k, n in lengths.items() if k > 0) == spec["drafts"]
    assert sum(k * n for k, n in lengths.items()) == spec["draft_tokens"]
    reached = cell["speculative"]["acceptance_per_reached_position"]
    assert reached[0] == pytest.approx(spec["per_position"][0] / spec["drafts"])
    assert all(r is None or 0 <= r <= 1 for r in reached)
    assert "spec" not in cell["plain"]
