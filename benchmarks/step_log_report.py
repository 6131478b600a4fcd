"""Summarise a ``SPECDEC_STEP_LOG`` file (specdec_plugin/step_log.py): what stalled, and where.

For one engine's log: the count of each event kind and of each drafter path, the runs (bursts
of work between idle gaps or empty steps, e.g. the benchmark's generate calls), each run's
length and its longest ``exec`` call, and the longest ``exec`` / ``sample`` / ``draft`` calls overall
with the scheduler's view of their step (requests, tokens, new requests, draft length).

    python benchmarks/step_log_report.py STEPS.jsonl [--top 8] [--gap-s 0.15] [--by-kind]

Session 27 found vLLM's async computed-token correction recompiling this way: ``exec`` calls of
0.3-1.0 s right after a one-request step, where the others took under 45 ms (patch P14).

``--by-kind``: the decode steps grouped by what the drafter did in them (a deferred pass, a
flush, a probe that drafted, a plain engine's step), each kind with its step period (from one
``exec`` to the next: under async scheduling, the rate the engine really runs at) and the
median host time of each call. Session 32 read this way that at batch 64 on an H200 the steps
after a deferred flush were the slow ones: the host ran past the device step there.

``--beside PLAIN.jsonl`` (with ``--by-kind``): the decode-step period of this engine and of
another engine logged on the same host (``bench_paired_plain.py``'s plain engine, whose runs
alternate with this one's) over the span of this log (``t`` is ``time.perf_counter``, one clock
for every process of a host). A method whose steps that draft nothing run slower than the
plain engine's in the same minutes was slowed by something other than drafting: session 49's
EAGLE with the measured probe price ran every step 4% slow beside another job's engine start,
read by hand this way.

``--run-starts N`` (with ``--beside PLAIN.jsonl`` or alone): the host time (``exec`` +
``sample``; a ``draft`` call runs inside ``sample_tokens``, so it is not added again) of each
run's first N steps, median over runs, per step position and summed. Session 51 found suffix and the draft model at batch 64 within 1.1-1.6% of plain
decoding in their decode steps and still 3% slower per run: about 15 ms sat in each run's
first steps (the prefill, then the probe step, where suffix built 64 requests' tries).
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from statistics import median

HOST_CALLS = ("exec", "sample", "draft")
# The runner's calls a step's host time is the sum of: vLLM proposes drafts inside
# sample_tokens, so a ``draft`` call's time is already part of its step's ``sample``.
STEP_HOST_CALLS = ("exec", "sample")


def load(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def split_runs(events: list[dict], gap_s: float) -> list[list[dict]]:
    """Bursts of work: a new one starts after the engine idled for more than ``gap_s`` (from
    one event to the start of the next call: an event is logged when its call ends, so a
    long call is not a gap) or ran an empty step (``exec`` of 0 tokens: nothing scheduled,
    as between a benchmark's back-to-back generate calls)."""
    runs: list[list[dict]] = [[]]
    last = None
    for event in events:
        start = event["t"] - event.get("ms", 0.0) / 1e3
        idle = event["kind"] == "exec" and event.get("tokens") == 0
        if idle or (last is not None and start - last > gap_s):
            if runs[-1]:
                runs.append([])
        if not idle:
            runs[-1].append(event)
        last = event["t"]
    # Without a step (the scheduler's and results' events around empty steps): not a run.
    return [run for run in runs if any(e["kind"] == "exec" for e in run)]


def longest_calls(events: list[dict], top: int) -> list[dict]:
    """The ``top`` longest host calls, each with the step the scheduler last built before it
    (None where the log has no scheduler events: a scheduler other than ours)."""
    step = None
    calls = []
    for event in events:
        if event["kind"] == "sched":
            step = {k: event.get(k) for k in ("n", "tokens", "new", "k")}
        elif event["kind"] in HOST_CALLS and "ms" in event:
            calls.append({**event, "step": step})
    return sorted(calls, key=lambda e: e["ms"], reverse=True)[:top]


def _steps(events: list[dict]) -> list[dict]:
    """One dict per engine step: the events from one ``exec`` call to the next, with the
    scheduler's ``sched`` event before it where there is one (our adaptive scheduler)."""
    steps, pending_sched, current = [], None, None
    for event in events:
        if event["kind"] == "sched":
            pending_sched = event
        elif event["kind"] == "exec":
            current = {"exec": event, "sched": pending_sched, "calls": []}
            pending_sched = None
            steps.append(current)
        elif current is not None:
            current["calls"].append(event)
    return steps


def _kind(step: dict) -> str:
    kinds = {e["kind"] for e in step["calls"]}
    drafts = [e for e in step["calls"] if e["kind"] == "draft"]
    if not drafts:
        return "no drafter call"
    name = "flush + " if "flush" in kinds else ""
    return name + ", ".join(sorted({f"{e['path']} k={e['k']}" for e in drafts}))


def by_kind(events: list[dict], gap_s: float = 0.15) -> dict:
    """Decode steps (no new request scheduled, at most twice the median step's tokens) grouped
    by ``_kind``: count, step period (ms from the previous step's ``exec`` to this one's, where
    the previous is a decode step too and no idle gap lies between) and median host ms of each
    call."""
    steps = _steps(events)
    tokens = [s["exec"]["tokens"] for s in steps if s["exec"].get("tokens")]
    if not tokens:
        return {}
    limit = 2 * median(tokens)

    def decode(step):
        sched = step["sched"]
        return (0 < step["exec"].get("tokens", 0) <= limit
                and (sched is None or sched.get("new", 0) == 0))

    groups: dict[str, dict[str, list[float]]] = {}
    periods_all = []
    for prev, step in zip(steps, steps[1:]):
        if not (decode(prev) and decode(step)):
            continue
        period = (step["exec"]["t"] - prev["exec"]["t"]) * 1e3
        if period > gap_s * 1e3:
            continue
        periods_all.append(period)
        group = groups.setdefault(_kind(step), {"period": [], "exec": [], "sample": [],
                                                "draft": [], "sched": []})
        group["period"].append(period)
        group["exec"].append(step["exec"]["ms"])
        for call in ("sample", "draft"):
            group[call].append(sum(e["ms"] for e in step["calls"] if e["kind"] == call))
        if step["sched"] is not None:
            group["sched"].append(step["sched"]["build_ms"])
    if not periods_all:
        return {}
    typical = median(periods_all)
    report = {"steps": len(periods_all), "period_median_ms": round(typical, 3),
              "period_mean_ms": round(sum(periods_all) / len(periods_all), 3),
              # Steps over 1.15x the median: where the engine fell behind its usual rate.
              "slow_steps": sum(p > 1.15 * typical for p in periods_all), "kinds": {}}
    for name, group in sorted(groups.items(), key=lambda kv: -len(kv[1]["period"])):
        periods = group["period"]
        report["kinds"][name] = {
            "steps": len(periods),
            "period_median_ms": round(median(periods), 3),
            "period_mean_ms": round(sum(periods) / len(periods), 3),
            **{f"{call}_median_ms": round(median(values), 3)
               for call, values in group.items() if call != "period" and values},
        }
    return report


def within_span(events: list[dict], other: list[dict]) -> list[dict]:
    """``other``'s events (another engine's log on the same host) within the span of
    ``events``."""
    start, end = events[0]["t"], events[-1]["t"]
    return [e for e in other if start <= e["t"] <= end]


def beside(events: list[dict], other: list[dict], gap_s: float = 0.15) -> dict:
    """The decode-step period of ``events`` and of ``other`` (another engine's log on the same
    host) within the span of ``events``: medians, and their ratio."""
    start, end = events[0]["t"], events[-1]["t"]
    mine, theirs = by_kind(events, gap_s), by_kind(within_span(events, other), gap_s)
    if not mine or not theirs:
        return {"this": mine or None, "beside": theirs or None, "ratio": None}
    this_period, that_period = mine["period_median_ms"], theirs["period_median_ms"]
    return {"span_s": round(end - start, 3),
            "this": {"steps": mine["steps"], "period_median_ms": this_period},
            "beside": {"steps": theirs["steps"], "period_median_ms": that_period},
            "ratio": round(this_period / that_period, 4)}


def run_starts(events: list[dict], first: int, gap_s: float = 0.15) -> dict:
    """Host ms of each run's first ``first`` steps (its ``exec`` and ``sample`` calls),
    median over the runs that have that many steps: per step position and summed."""
    per_run = []
    for run in split_runs(events, gap_s):
        steps = _steps(run)[:first]
        if len(steps) == first:
            per_run.append([s["exec"]["ms"] + sum(e["ms"] for e in s["calls"]
                                                   if e["kind"] in STEP_HOST_CALLS)
                            for s in steps])
    if not per_run:
        return {"runs": 0}
    return {"runs": len(per_run),
            "host_ms_by_step": [round(median(run[i] for run in per_run), 3)
                                for i in range(first)],
            "host_ms_sum": round(median(sum(run) for run in per_run), 3)}


def summarise(events: list[dict], top: int = 8, gap_s: float = 0.15) -> dict:
    runs = split_runs(events, gap_s)
    return {
        "events": dict(Counter(e["kind"] for e in events)),
        "drafter_paths": dict(Counter(e["path"] for e in events if e["kind"] == "draft")),
        "runs": [{
            "start_s": round(run[0]["t"] - events[0]["t"], 3),
            "length_s": round(run[-1]["t"] - run[0]["t"] + run[0].get("ms", 0.0) / 1e3, 3),
            "steps": sum(1 for e in run if e["kind"] == "exec"),
            "longest_exec_ms": max((e["ms"] for e in run if e["kind"] == "exec"), default=0.0),
        } for run in runs],
        "longest_calls": [{
            "at_s": round(e["t"] - events[0]["t"], 3), "kind": e["kind"], "ms": e["ms"],
            **{k: e[k] for k in ("tokens", "path", "k") if k in e}, "step": e["step"],
        } for e in longest_calls(events, top)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log")
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--gap-s", type=float, default=0.15,
                        help="an idle gap longer than this starts a new run")
    parser.add_argument("--by-kind", action="store_true",
                        help="decode steps grouped by what the drafter did, with step periods")
    parser.add_argument("--beside", metavar="OTHER_LOG",
                        help="with --by-kind: also the decode-step period of another engine's "
                             "log on the same host over this log's span, and the ratio")
    parser.add_argument("--run-starts", type=int, metavar="N",
                        help="host ms of each run's first N steps (median over runs); with "
                             "--beside, the other log's runs in this log's span too")
    args = parser.parse_args()
    if args.beside and not (args.by_kind or args.run_starts):
        parser.error("--beside goes with --by-kind or --run-starts")
    events = load(args.log)
    if not events:
        print("empty log")
        return
    if args.run_starts:
        report = {"this": run_starts(events, args.run_starts, args.gap_s)}
        if args.beside:
            report["beside"] = run_starts(within_span(events, load(args.beside)),
                                          args.run_starts, args.gap_s)
        print(json.dumps(report, indent=1))
        return
    if args.by_kind:
        report = by_kind(events, args.gap_s)
        if args.beside:
            report = {**report, "beside": beside(events, load(args.beside), args.gap_s)}
        print(json.dumps(report, indent=1))
        return
    report = summarise(events, args.top, args.gap_s)
    print("events:", report["events"])
    print("drafter paths:", report["drafter_paths"])
    print("runs (start s, length s, steps, longest exec ms):")
    for run in report["runs"]:
        print(f"  {run['start_s']:9.3f} {run['length_s']:8.3f} {run['steps']:6d} "
              f"{run['longest_exec_ms']:10.1f}")
    print(f"longest host calls (of {', '.join(HOST_CALLS)}):")
    for call in report["longest_calls"]:
        print("  " + json.dumps(call))


if __name__ == "__main__":
    main()
