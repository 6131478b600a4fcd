"""benchmarks/compare_host_ops.py on made-up traces (no GPU): the same launches in both, every
host operator in B slower by a random factor inside the range, the range's device time the
same."""
from __future__ import annotations

import random

import pytest

from tests.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def tool():
    return load_benchmark("compare_host_ops")


def _trace(rng: random.Random, slow: float, durations: dict[str, list[int]]) -> list[dict]:
    """A range holding each operator's calls one after another, each call launching one
    kernel; an operator call outside the range (before it) that must not count."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 999}]
    t, corr = 1000, 1
    start = t
    for name, calls in durations.items():
        for dur in calls:
            d = dur * slow
            events.append({"ph": "X", "cat": "cpu_op", "name": name, "ts": t, "dur": d})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                           "ts": t + 1, "dur": 1, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": "k", "ts": t + 50, "dur": 7,
                           "args": {"correlation": corr}})
            t += d + 2
            corr += 1
    events.append({"ph": "X", "cat": "user_annotation", "name": "gpu_model_runner: forward",
                   "ts": start, "dur": t - start})
    rng.shuffle(events)
    return events


def test_every_operator_slower_by_the_same_factor_reads_that_factor(tool):
    rng = random.Random()
    slow = rng.uniform(1.2, 2.0)
    durations = {name: [rng.randrange(10, 400) for _ in range(rng.randint(3, 9))]
                 for name in ("aten::mm", "vllm::unified_attention_with_output", "triton_x")}
    calls = sum(map(len, durations.values()))
    a_events, b_events = _trace(rng, 1.0, durations), _trace(rng, slow, durations)
    a = tool.window_summary(a_events, *tool.range_window(a_events, "gpu_model_runner: forward", 0))
    b = tool.window_summary(b_events, *tool.range_window(b_events, "gpu_model_runner: forward", 0))
    assert a["launches"] == b["launches"] == a["kernels"] == calls
    assert a["device_us"] == b["device_us"] == 7 * calls
    assert b["host_us"] > a["host_us"]
    # The call before the range is not counted.
    assert len(a["ops"]["aten::mm"]) == len(durations["aten::mm"])
    lines = tool.compare(a, b, top=5)
    ratio = float(next(line for line in lines if line.startswith("median over")).split()[-1])
    assert ratio == pytest.approx(slow, rel=1e-3)


def test_a_missing_occurrence_is_an_error_naming_the_range(tool):
    with pytest.raises(SystemExit, match="gpu_model_runner: forward"):
        tool.range_window([], "gpu_model_runner: forward", 0)
