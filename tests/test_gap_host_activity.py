"""benchmarks/gap_host_activity.py on made-up traces (no GPU): each device gap is attributed to
the host ranges and operators that ran on the launching thread until the late launch."""
from __future__ import annotations

import random

import pytest

from tests.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def gaps():
    return load_benchmark("gap_host_activity")


def _step_events(rng: random.Random, t0: int, corr: int):
    """One step: the device runs a kernel, then idles while the host runs a range holding an
    op and bare Python, then launches a graph whose first kernel ends the gap."""
    kernel_end = t0 + rng.randrange(50, 100)
    op_len = rng.randrange(20, 200)
    py_len = rng.randrange(20, 200)
    wait_len = rng.randrange(0, 50)  # an op that began before the gap (a sync returning)
    op_start = kernel_end - wait_len
    sync_end = kernel_end + rng.randrange(1, 30)
    launch = sync_end + op_len + py_len
    gap_end = launch + rng.randrange(5, 20)
    events = [
        {"ph": "X", "cat": "kernel", "name": "last_kernel", "ts": t0, "dur": kernel_end - t0,
         "args": {"correlation": corr - 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventSynchronize", "ts": op_start,
         "dur": sync_end - op_start, "pid": 1, "tid": 7},
        {"ph": "X", "cat": "user_annotation", "name": "prepare", "ts": sync_end,
         "dur": op_len + py_len, "pid": 1, "tid": 7},
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": sync_end, "dur": op_len,
         "pid": 1, "tid": 7},
        # Nested inside aten::copy_: part of its parent's time, never counted twice.
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": sync_end + 1,
         "dur": 1, "pid": 1, "tid": 7},
        {"ph": "X", "cat": "user_annotation", "name": "forward", "ts": launch, "dur": 40,
         "pid": 1, "tid": 7},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": launch, "dur": 30,
         "pid": 1, "tid": 7, "args": {"correlation": corr}},
        {"ph": "X", "cat": "kernel", "name": "embedding", "ts": gap_end, "dur": 20,
         "args": {"correlation": corr}},
    ]
    expect = {"gap": gap_end - kernel_end, "sync": sync_end - kernel_end, "op": op_len,
              "python": py_len, "late": launch - kernel_end}
    return events, expect, gap_end + 20


def test_gaps_are_split_by_range_and_operator(gaps):
    rng = random.Random()
    steps = rng.randrange(2, 7)
    events, expected, t = [], [], 0
    for i in range(steps):
        ev, exp, t = _step_events(rng, t, 10 * (i + 1))
        events += ev
        expected.append(exp)
    rng.shuffle(events)  # a trace's order is not time order
    got = gaps.attribute(events, steps, min_us=1)

    assert got["gaps"] == steps
    total = sum(e["gap"] for e in expected)
    assert got["gap_us_per_step"] == pytest.approx(total / steps, abs=0.1)
    by_op = got["host_time_in_gaps_by_operator_us_per_step"]
    assert by_op["cudaEventSynchronize"] == pytest.approx(sum(e["sync"] for e in expected) / steps, abs=0.1)
    assert by_op["aten::copy_"] == pytest.approx(sum(e["op"] for e in expected) / steps, abs=0.1)
    assert by_op["(python: no operator)"] == pytest.approx(
        sum(e["python"] for e in expected) / steps, abs=0.1)
    assert "cudaMemcpyAsync" not in by_op
    by_range = got["host_time_in_gaps_by_range_us_per_step"]
    assert by_range["prepare"] == pytest.approx(sum(e["op"] + e["python"] for e in expected) / steps, abs=0.1)
    assert by_range["(no range)"] == pytest.approx(sum(e["sync"] for e in expected) / steps, abs=0.1)
    [ended] = got["gaps_ended_by"]
    assert (ended["launch"], ended["first_device_event"], ended["ranges"], ended["count"]) == (
        "cudaGraphLaunch", "embedding", "forward", steps)
    assert ended["launch_late_by_us_mean"] == pytest.approx(
        sum(e["late"] for e in expected) / steps, abs=0.1)


def test_short_gaps_are_left_out(gaps):
    rng = random.Random()
    events, expected, _ = _step_events(rng, 0, 10)
    got = gaps.attribute(events, 1, min_us=expected["gap"] + 1)
    assert got["gaps"] == 0 and got["gap_us_per_step"] == 0


def test_a_gap_whose_launch_is_not_in_the_trace_still_counts(gaps):
    rng = random.Random()
    events, expected, _ = _step_events(rng, 0, 10)
    events = [e for e in events if e["name"] != "cudaGraphLaunch"]  # the profiler missed it
    got = gaps.attribute(events, 1, min_us=1)
    [ended] = got["gaps_ended_by"]
    assert (ended["launch"], ended["count"]) == (gaps.UNKNOWN_LAUNCH, 1)
    assert ended["gap_us_per_step"] == pytest.approx(expected["gap"], abs=0.1)
    assert ended["launch_late_by_us_mean"] is None
    assert got["gap_us_per_step"] == pytest.approx(expected["gap"], abs=0.1)
