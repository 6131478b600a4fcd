"""benchmarks/trace_host_calls.py on made-up traces (no GPU): call counts per step, and each long
device gap attributed to the host call that issued the device's next event."""
from __future__ import annotations

import random

import pytest

from tests.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def trace_host_calls():
    return load_benchmark("trace_host_calls")


def _trace(rng: random.Random):
    """Back-to-back kernels, with a few long gaps. Each device event is issued by a host call
    that begins before it, the calls one after another as on the engine's one thread, each
    pair linked by a correlation id as the profiler links them; for the events after a long
    gap the issuing call's start and name are chosen here, and returned as what the script
    must find. Calls that issue nothing (event queries) sit in between, unlinked."""
    events, expected = [], []
    t, host_clock = 0.0, -1.0
    names = ["cudaGraphLaunch", "cudaLaunchKernel", "cudaMemcpyAsync"]
    for i in range(rng.randrange(30, 80)):
        long_gap = i > 0 and rng.random() < 0.2
        idle = rng.uniform(400, 1500) if long_gap else rng.uniform(0, 5)
        start = t + idle
        if long_gap:
            # Issued anywhere from before the device ran dry (a slow call) to just before the
            # event (a late host), after the previous call.
            call_start = rng.uniform(max(host_clock, t - 300) + 0.01, start - 10)
            call = rng.choice(names)
            dur = rng.uniform(1, start - 1 - call_start)
            expected.append({"idle_us": idle, "call": call, "lead_us": call_start - t})
        else:
            call, call_start, dur = "cudaLaunchKernel", max(host_clock + 0.01, start - 0.5), 0.05
        events.append({"ph": "X", "cat": "cuda_runtime", "name": call, "ts": call_start,
                       "dur": dur, "args": {"correlation": 2 * i}})
        host_clock = call_start + dur
        if host_clock < start - 0.2:  # a call that issues no device work, just before the event
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaEventQuery",
                           "ts": start - 0.15, "dur": 0.1, "args": {"correlation": 2 * i + 1}})
            host_clock = start - 0.05
        kernel_dur = rng.uniform(1, 50)
        events.append({"ph": "X", "cat": "kernel", "name": f"k{i % 3}", "ts": start,
                       "dur": kernel_dur, "args": {"correlation": 2 * i}})
        t = start + kernel_dur
    return events, expected


def test_long_gaps_are_attributed_to_the_call_that_issued_the_next_event(trace_host_calls):
    rng = random.Random()
    events, expected = _trace(rng)
    got = trace_host_calls.gap_causes(events, gap_us=300.0)
    assert len(got) == len(expected)
    for g, want in zip(got, expected):
        assert g["call"] == want["call"]
        assert g["idle_us"] == pytest.approx(want["idle_us"])
        assert g["lead_us"] == pytest.approx(want["lead_us"])


def test_call_counts_per_step(trace_host_calls):
    rng = random.Random()
    events, _ = _trace(rng)
    steps = rng.randrange(1, 9)
    counts = trace_host_calls.call_counts(events, steps)
    host = [e for e in events if e["cat"] == "cuda_runtime"]
    assert sum(c["per_step"] for c in counts.values()) == pytest.approx(len(host) / steps)
    for name, c in counts.items():
        mine = [e for e in host if e["name"] == name]
        assert c["per_step"] == pytest.approx(len(mine) / steps)
        assert c["host_us_per_step"] == pytest.approx(sum(e["dur"] for e in mine) / steps)
