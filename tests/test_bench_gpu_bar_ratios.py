"""benchmarks/bench_gpu_side_by_side.py's issue-11 bar ratios, without a GPU: each backend's
ms/token over the better of our plain decoding and K every step at the same cell."""
from __future__ import annotations

import random

import pytest

from tests.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_gpu_side_by_side")


def test_ratios_to_the_better_of_plain_and_static(bench, capsys):
    rng = random.Random()
    rows, expect = [], {}
    for workload in ("prose", "code_edit"):
        for batch in (4, 16):
            plain, static = rng.uniform(4, 8), rng.uniform(2, 9)
            dplain, dstatic = rng.uniform(4, 8), rng.uniform(2, 9)
            rows.append({"method": "none", "batch": batch, "workload": workload,
                         "ours_ms_per_token": plain, "ours_decode_ms_per_token": dplain})
            row = {"method": "eagle3", "batch": batch, "workload": workload,
                   "ours_static_ms_per_token": static, "ours_static_decode_ms_per_token": dstatic}
            for name in ("ours", "ours_interp"):
                row[f"{name}_ms_per_token"] = rng.uniform(2, 9)
                row[f"{name}_decode_ms_per_token"] = rng.uniform(2, 9)
                expect[(workload, batch, name)] = (
                    row[f"{name}_ms_per_token"] / min(plain, static),
                    row[f"{name}_decode_ms_per_token"] / min(dplain, dstatic))
            rows.append(row)
    # A cell without K every step gets no ratio.
    rows.append({"method": "ngram", "batch": 4, "workload": "prose", "ours_ms_per_token": 5.0})
    bench._add_ratios_to_best(rows)
    for r in rows:
        if r["method"] != "eagle3":
            assert not any(k.endswith("vs_best") for k in r)
            continue
        for name in ("ours", "ours_interp"):
            ratio, decode = expect[(r["workload"], r["batch"], name)]
            assert r[f"{name}_vs_best"] == pytest.approx(ratio, rel=1e-12)
            assert r[f"{name}_decode_vs_best"] == pytest.approx(decode, rel=1e-12)
    bench._print_bar(rows)
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 4
    for line, r in zip(printed, [r for r in rows if r["method"] == "eagle3"]):
        missed = r["ours_vs_best"] > 1 / 0.97
        assert (f"ours {r['ours_vs_best']:.3f}*" in line) == missed


def test_suffix_cache_of_finished_requests_is_off_unless_asked(bench):
    """Session 42's run left --suffix-max-cached-requests out and timed suffix on answers its
    cache already held from the warm-up: the padded setup now turns that cache off by default."""
    import argparse

    parser = argparse.ArgumentParser()
    bench.add_setup_arguments(parser)
    default = parser.parse_args([]).suffix_max_cached_requests
    assert bench.suffix_cache_setting(default) == {"suffix_decoding_max_cached_requests": 0}
    n = random.randint(1, 10_000)
    asked = parser.parse_args(["--suffix-max-cached-requests", str(n)]).suffix_max_cached_requests
    assert bench.suffix_cache_setting(asked) == {"suffix_decoding_max_cached_requests": n}
    assert bench.suffix_cache_setting(-1) == {}  # vLLM's own default
