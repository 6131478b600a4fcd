"""benchmarks/trace_steps.py on made-up device traces (no GPU): busy, idle and by-kernel sums."""
from __future__ import annotations

import gzip
import json
import random

import pytest

from tests.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def trace_steps():
    return load_benchmark("trace_steps")


def _random_events(rng: random.Random, n: int) -> list[dict]:
    """Device events on two streams with integer times, so that a unit grid is exact; host
    events in between, which must not count. Spread over 8,000 us: some gaps reach 100 us."""
    events = []
    for _ in range(n):
        start = rng.randrange(0, 8000)
        events.append({"ph": "X", "cat": rng.choice(["kernel", "kernel", "gpu_memcpy"]),
                       "name": rng.choice(["gemm", "attn", "copy"]), "ts": start,
                       "dur": rng.randrange(1, 40)})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm",
                       "ts": rng.randrange(0, 2000), "dur": rng.randrange(1, 400)})
    return events


def test_busy_idle_and_kernels_match_a_unit_grid(trace_steps, tmp_path):
    rng = random.Random()
    events = _random_events(rng, rng.randrange(20, 80))
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    steps = rng.randrange(1, 9)
    got = trace_steps.summarize_trace(str(path), steps)

    device = [e for e in events if e["cat"] != "cpu_op"]
    covered = set()
    for e in device:
        covered.update(range(e["ts"], e["ts"] + e["dur"]))
    first = min(e["ts"] for e in device)
    last = max(e["ts"] + e["dur"] for e in device)
    assert got["events"] == len(device)
    assert got["busy_us_per_step"] == pytest.approx(len(covered) / steps)
    assert got["window_us_per_step"] == pytest.approx((last - first) / steps)
    assert got["idle_us_per_step"] == pytest.approx((last - first - len(covered)) / steps)
    idle_in_buckets = sum(b["us_per_step"] for b in got["idle_gaps_us"].values())
    assert idle_in_buckets == pytest.approx(got["idle_us_per_step"])
    # Gaps of 100 us or more, by the events around them: three names make at most nine
    # pairs, all listed; together they hold every such gap.
    long_gaps, end = 0.0, None
    for start, stop in sorted((e["ts"], e["ts"] + e["dur"]) for e in device):
        if end is not None and start - end >= 100:
            long_gaps += start - end
        end = stop if end is None else max(end, stop)
    boundaries = got["idle_by_boundary_us_per_step"]
    assert sum(b["us_per_step"] for b in boundaries) == pytest.approx(long_gaps / steps)
    for name in {e["name"] for e in device}:
        mine = [e for e in device if e["name"] == name]
        row = got["kernels_us_per_step"][name]
        assert row["count"] == len(mine)
        assert row["us_per_step"] == pytest.approx(sum(e["dur"] for e in mine) / steps)


def test_diff_lists_what_moved(trace_steps):
    base = {"window_us_per_step": 100.0, "busy_us_per_step": 90.0, "idle_us_per_step": 10.0,
            "kernels_us_per_step": {"gemm": {"count": 4, "us_per_step": 80.0},
                                    "attn": {"count": 4, "us_per_step": 10.0}}}
    other = {"window_us_per_step": 120.0, "busy_us_per_step": 105.0, "idle_us_per_step": 15.0,
             "kernels_us_per_step": {"gemm": {"count": 4, "us_per_step": 80.5},
                                     "flush": {"count": 1, "us_per_step": 15.0},
                                     "attn": {"count": 4, "us_per_step": 10.0}}}
    lines = trace_steps.diff(base, other)
    assert lines[0].split()[-1] == "+20.0"
    assert lines[2].split()[-1] == "+5.0"
    moved = [line.split()[0] for line in lines[3:]]
    assert moved == ["flush"]  # gemm moved 0.5 us, under the 2 us floor
