"""benchmarks/step_log_report.py on a random step log (specdec_plugin/step_log.py's format, on a
fake clock): runs split at idle gaps, the longest host calls found with their step."""
from __future__ import annotations

import json
import random

from tests.benchmark_scripts import load_benchmark


def _write_log(path, runs: int, steps: int, stall_run: int, stall_ms: float) -> None:
    """``runs`` bursts of ``steps`` steps on a fake clock; one ``exec`` of ``stall_ms``."""
    rng = random.Random()
    lines = []
    t = 100.0
    for run in range(runs):
        for step in range(steps):
            n = rng.randint(2, 64)
            lines.append({"t": t, "kind": "sched", "n": n, "tokens": n, "new": 0, "k": 0})
            ms = stall_ms if (run, step) == (stall_run, 3) else rng.uniform(0.5, 20.0)
            t += ms / 1e3
            lines.append({"t": t, "kind": "exec", "ms": ms, "tokens": n})
            lines.append({"t": t, "kind": "draft", "path": rng.choice(["deferred", "replay"]),
                          "k": 0, "tokens": n, "ms": rng.uniform(0.1, 1.0)})
            t += rng.uniform(0.001, 0.01)
        if rng.random() < 0.5:
            t += 1.0  # idle between runs
        else:  # back to back, as a benchmark's generate calls: empty steps between them
            lines.append({"t": t, "kind": "exec", "ms": 0.2, "tokens": 0})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_runs_and_the_stalled_call_are_found(tmp_path):
    report_module = load_benchmark("step_log_report")
    runs, steps = random.randint(3, 6), random.randint(10, 30)
    stall_run = random.randrange(runs)
    path = tmp_path / "steps.jsonl"
    _write_log(path, runs, steps, stall_run, stall_ms=800.0)

    report = report_module.summarise(report_module.load(str(path)), top=3)

    assert [r["steps"] for r in report["runs"]] == [steps] * runs
    assert [r["longest_exec_ms"] == 800.0 for r in report["runs"]] == [
        i == stall_run for i in range(runs)]
    top = report["longest_calls"][0]
    assert top["kind"] == "exec" and top["ms"] == 800.0
    assert top["step"]["n"] == top["tokens"]  # the step the scheduler built before it
    events = report["events"]
    assert events["sched"] == events["draft"] == runs * steps
    assert events["exec"] >= runs * steps  # the empty steps between back-to-back runs too
    assert sum(report["drafter_paths"].values()) == runs * steps


def test_steps_are_grouped_by_what_the_drafter_did(tmp_path):
    """A fake engine at one request count: every ``every``-th step flushes and the step after a
    flush runs ``late_ms`` late; prefills (new requests) and idle gaps are left out."""
    report_module = load_benchmark("step_log_report")
    rng = random.Random()
    n, every, late_ms = rng.randint(8, 64), rng.randint(3, 6), rng.uniform(0.5, 2.0)
    base_ms, steps = 5.0, rng.randint(60, 120)
    lines, t = [], 100.0
    lines.append({"t": t, "kind": "sched", "n": n, "tokens": 40 * n, "new": n, "k": 0})
    lines.append({"t": t, "kind": "exec", "ms": 30.0, "tokens": 40 * n})  # the prefill
    for step in range(steps):
        t += (base_ms + (late_ms if step % every == 1 else 0.0)) / 1e3
        lines.append({"t": t - 0.004, "kind": "sched", "n": n, "tokens": n, "new": 0, "k": 0,
                      "build_ms": 0.8})
        lines.append({"t": t, "kind": "exec", "ms": 2.0, "tokens": n})
        if step % every == 0:
            lines.append({"t": t + 0.001, "kind": "flush", "reqs": n, "tokens": n * every})
        lines.append({"t": t + 0.001, "kind": "draft", "path": "deferred", "k": 0, "tokens": n,
                      "ms": 1.2 if step % every == 0 else 0.2})
        lines.append({"t": t + 0.0012, "kind": "sample", "ms": 1.0})
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))

    report = report_module.by_kind(report_module.load(str(path)))

    kinds = report["kinds"]
    assert set(kinds) == {"deferred k=0", "flush + deferred k=0"}
    assert report["steps"] == steps - 1  # the first decode step follows the prefill
    flushes = len(range(every, steps, every))
    assert kinds["flush + deferred k=0"]["steps"] == flushes
    assert abs(kinds["flush + deferred k=0"]["draft_median_ms"] - 1.2) < 1e-9
    assert abs(kinds["deferred k=0"]["sched_median_ms"] - 0.8) < 1e-9
    assert abs(report["period_median_ms"] - base_ms) < 1e-6
    # Slow: over 1.15x the median period (5.75 ms here).
    late = len(range(1, steps, every))
    assert report["slow_steps"] == (late if base_ms + late_ms > 1.15 * base_ms else 0)
    # The late steps are the ones after a flush, not the flushes.
    assert abs(kinds["flush + deferred k=0"]["period_mean_ms"] - base_ms) < 1e-3
    assert kinds["deferred k=0"]["period_mean_ms"] > base_ms + 0.1


def _engine_steps(start: float, steps: int, period_ms: float, n: int) -> list[dict]:
    """A plain engine's decode steps on the host clock from ``start``: ``exec`` then ``sample``."""
    lines, t = [], start
    for _ in range(steps):
        t += period_ms / 1e3
        lines.append({"t": t, "kind": "exec", "ms": 2.0, "tokens": n})
        lines.append({"t": t + 0.0005, "kind": "sample", "ms": 0.5})
    return lines


def test_beside_compares_step_periods_within_this_logs_span():
    """``--beside``: the other engine's steps count only within this log's span, so its steps
    before and after (at another rate) do not move its period."""
    report_module = load_benchmark("step_log_report")
    rng = random.Random()
    n, plain_ms = rng.randint(8, 64), rng.uniform(4.0, 6.0)
    slow = rng.uniform(1.02, 1.10)
    method = _engine_steps(200.0, rng.randint(80, 160), plain_ms * slow, n)
    span = (method[0]["t"], method[-1]["t"])
    # The plain engine: far slower outside the method's span, at plain_ms within it.
    other = (_engine_steps(100.0, 50, 3 * plain_ms, n)
             + _engine_steps(span[0], int((span[1] - span[0]) * 1e3 / plain_ms), plain_ms, n)
             + _engine_steps(span[1] + 1.0, 50, 3 * plain_ms, n))

    report = report_module.beside(method, other)

    assert abs(report["this"]["period_median_ms"] - plain_ms * slow) < 1e-3
    assert abs(report["beside"]["period_median_ms"] - plain_ms) < 1e-3
    assert abs(report["ratio"] - slow) < 1e-3
    # Nothing of the other engine's in the span: no ratio, not a made-up one.
    empty = report_module.beside(method, other[:100])
    assert empty["ratio"] is None and empty["beside"] is None


def test_run_starts_reads_the_first_steps_host_time_of_every_run():
    """``--run-starts N``: each run's first N steps' host time (exec and sample; a draft call,
    inside sample_tokens, is not counted twice), median over runs per position; runs shorter
    than N do not count."""
    report_module = load_benchmark("step_log_report")
    rng = random.Random()
    first = rng.randint(2, 5)
    start_ms = [rng.uniform(5.0, 40.0) for _ in range(first)]  # each position's cost
    lines, t = [], 100.0
    runs = rng.randint(3, 7)
    for run in range(runs):
        for step in range(rng.randint(first + 1, 30)):
            ms = start_ms[step] if step < first else rng.uniform(1.0, 3.0)
            t += ms / 1e3
            lines.append({"t": t, "kind": "exec", "ms": ms, "tokens": 64})
            t += 0.0003
            lines.append({"t": t, "kind": "draft", "path": "eager", "k": 1, "ms": 0.3})
            t += 0.0002  # the draft ran inside this sample_tokens call
            lines.append({"t": t, "kind": "sample", "ms": 0.5})
        t += 1.0  # idle between runs
    # A run too short to count.
    lines.append({"t": t, "kind": "exec", "ms": 99.0, "tokens": 64})

    report = report_module.run_starts(lines, first)

    assert report["runs"] == runs
    assert report["host_ms_by_step"] == [round(ms + 0.5, 3) for ms in start_ms]
    assert abs(report["host_ms_sum"] - sum(start_ms) - 0.5 * first) < 1e-3  # rounded to us
    assert report_module.run_starts(lines[:0], first) == {"runs": 0}
