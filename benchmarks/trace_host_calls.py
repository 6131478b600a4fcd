"""The host's side of a profiled ``generate``: CUDA runtime calls per step, and for each long
device gap, the host call the device was waiting for.

``trace_steps.py`` says how long the device sat idle and between which kernels; this says why,
from the same trace's runtime events (the torch profiler records them with CUPTI even under
``profile_engine.py --device-only``):

- calls: every CUDA runtime / driver call by name, count and host time per engine step. One
  engine making more calls than another (copies, event queries) is host work the other avoids;
- gaps: for each idle stretch of ``--gap-us`` or more, the host call that issued the device's
  next event (the profiler's correlation id links the two: usually a ``cudaGraphLaunch`` or a
  copy), when it began relative to the device going idle (``lead``:
  negative = issued before the device ran dry, i.e. the call itself was slow; positive = the
  host came late by that much), and how long it took.

Caveat (session 61, H200): under CUPTI a ``cudaGraphLaunch`` of a ~420-node full graph took
650-810 us on the host, against tens of us unprofiled, and the device could not start the graph
before the call returned; gaps that end in such a launch are inflated by the profiler. Counts of
calls are not; use them to compare engines, and timed runs for the cost.

    python benchmarks/trace_host_calls.py TRACE.json.gz --steps 43
    python benchmarks/trace_host_calls.py A_TRACE.json.gz B_TRACE.json.gz --steps 43  # A beside B

``--steps``: the engine steps of the profiled call (tokens / acceptance length for one request).
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its sibling, run or loaded
from trace_steps import DEVICE_CATEGORIES, _load  # noqa: E402

HOST_CATEGORIES = ("cuda_runtime", "cuda_driver")


def call_counts(events: list[dict], steps: int) -> dict[str, dict]:
    """Runtime/driver calls by name: count and host us per step."""
    count, host_us = Counter(), Counter()
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in HOST_CATEGORIES:
            count[e["name"]] += 1
            host_us[e["name"]] += float(e.get("dur", 0.0))
    return {name: {"per_step": n / steps, "host_us_per_step": host_us[name] / steps}
            for name, n in count.most_common()}


def gap_causes(events: list[dict], gap_us: float) -> list[dict]:
    """For each device gap of gap_us or more: the host call that issued the next device event
    (matched by the profiler's correlation id), its lead over the gap's start and its
    duration. A gap whose next event has no matching call is left out."""
    device = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e.get("name", "?"),
                     e.get("args", {}).get("correlation"))
                    for e in events
                    if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES)
    issued_by = {e["args"]["correlation"]: (float(e["ts"]), float(e.get("dur", 0.0)), e["name"])
                 for e in events
                 if e.get("ph") == "X" and e.get("cat") in HOST_CATEGORIES
                 and "correlation" in e.get("args", {})}
    out, busy_until = [], device[0][1] if device else 0.0
    for start, end, name, correlation in device[1:]:
        idle = start - busy_until
        if idle >= gap_us and correlation in issued_by:
            h_start, h_dur, h_name = issued_by[correlation]
            out.append({"idle_us": idle, "next": name[:60], "call": h_name,
                        "lead_us": h_start - busy_until, "call_us": h_dur})
        busy_until = max(busy_until, end)
    return out


def report(path: str, steps: int, gap_us: float) -> dict:
    events = _load(path)
    calls = call_counts(events, steps)
    gaps = gap_causes(events, gap_us)
    by_call = Counter(g["call"] for g in gaps)
    return {
        "calls": calls,
        "calls_per_step": sum(c["per_step"] for c in calls.values()),
        "gaps": len(gaps),
        "gap_idle_us_per_step": sum(g["idle_us"] for g in gaps) / steps,
        "gaps_by_call": dict(by_call),
        "gaps_ending_in_slow_call": sum(1 for g in gaps if g["lead_us"] < 0),
        "median_lead_us": sorted(g["lead_us"] for g in gaps)[len(gaps) // 2] if gaps else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+", help="one or two device traces (trace_device.json.gz)")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--gap-us", type=float, default=300.0)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()
    reports = [report(t, args.steps, args.gap_us) for t in args.traces]
    names = list(dict.fromkeys(n for r in reports for n in list(r["calls"])[:args.top]))
    labels = [os.path.basename(t)[:24] for t in args.traces]
    header = "".join(f"{label:>26s}" for label in labels)
    print(f"{'call (per step: count / host us)':34s}{header}")
    for name in names:
        cells = []
        for r in reports:
            c = r["calls"].get(name, {"per_step": 0.0, "host_us_per_step": 0.0})
            cells.append(f"{c['per_step']:9.1f} / {c['host_us_per_step']:9.1f}")
        print(f"{name[:34]:34s}" + "".join(f"{c:>26s}" for c in cells))
    for key in ("calls_per_step", "gaps", "gap_idle_us_per_step", "gaps_ending_in_slow_call",
                "median_lead_us", "gaps_by_call"):
        values = (round(r[key], 1) if isinstance(r[key], float) else r[key] for r in reports)
        print(f"{key:34s}" + "".join(f"{str(v):>26s}" for v in values))


if __name__ == "__main__":
    main()
