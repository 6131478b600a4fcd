"""What the GPU did during a profiled ``generate``: busy and idle time, and device time by kernel.

Reads a torch-profiler chrome trace (``profile_engine.py`` writes one per engine) and answers
the question a side-by-side ratio cannot: when a speculative engine that drafts nothing is
slower than plain decoding, is the GPU doing more work (which kernels, how much per step), or
is it waiting for the host (idle gaps between launches)?

- busy: the union of every kernel, memcpy and memset interval on the device, so overlapping
  streams are counted once; idle = window - busy, where the window runs from the first device
  event to the last;
- gaps: idle stretches between consecutive device events, bucketed by length (a graph replay
  leaves sub-microsecond gaps; a host that falls behind leaves gaps of tens to hundreds of us);
- kernels: device time and count by name (graph replays show their kernels by name too);
- boundaries: the idle time of gaps of ``BOUNDARY_MIN_US`` or more by the pair of events
  around them (the last to end before, the first to start after): a gap between one step's
  last kernel and the next step's first is the host launching late (session 26: 955 of plain
  decoding's 1,586 idle us per profiled step at batch 64 sat there).

Per-step figures divide by ``--steps`` (the decode steps of the profiled call: max_tokens).

    python benchmarks/trace_steps.py TRACE.json.gz --steps 128
    python benchmarks/trace_steps.py --diff A/summary.json B/summary.json   # B minus A, per step
"""
from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# Idle gaps by length (us): below 5 is launch-to-launch inside a graph or a queued stream.
GAP_EDGES_US = (5, 20, 100, 500)
# Gaps this long or longer are attributed to the events around them.
BOUNDARY_MIN_US = 100


def _load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def device_intervals(events: list[dict]) -> list[tuple[float, float, str]]:
    """(start_us, end_us, name) of every device event, sorted by start."""
    out = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e.get("name", "?"))
           for e in events
           if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES]
    out.sort()
    return out


def timeline(intervals: list[tuple[float, float, str]], steps: int, top: int = 40) -> dict:
    """Busy/idle and by-kernel totals of sorted device intervals; per-step where it says so."""
    if not intervals:
        return {"events": 0}
    steps = max(steps, 1)
    # From the first start to the latest end: the last event to start may end before an
    # earlier, longer one on another stream.
    window = max(end for _, end, _ in intervals) - intervals[0][0]
    busy = 0.0
    gaps = [0] * (len(GAP_EDGES_US) + 1)
    gap_us = [0.0] * (len(GAP_EDGES_US) + 1)
    boundaries: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    cur_start, cur_end, last_name = intervals[0][0], intervals[0][1], intervals[0][2]
    for start, end, name in intervals[1:]:
        if start > cur_end:  # an idle stretch: the device had nothing queued
            busy += cur_end - cur_start
            gap = start - cur_end
            bucket = sum(gap >= edge for edge in GAP_EDGES_US)
            gaps[bucket] += 1
            gap_us[bucket] += gap
            if gap >= BOUNDARY_MIN_US:
                boundaries[(last_name, name)][0] += 1
                boundaries[(last_name, name)][1] += gap
            cur_start, cur_end, last_name = start, end, name
        elif end >= cur_end:
            cur_end, last_name = end, name
    busy += cur_end - cur_start
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for start, end, name in intervals:
        by_name[name][0] += 1
        by_name[name][1] += end - start
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])
    labels = [f"<{GAP_EDGES_US[0]}"] + [f"{lo}-{hi}" for lo, hi in zip(GAP_EDGES_US, GAP_EDGES_US[1:])] \
        + [f">={GAP_EDGES_US[-1]}"]
    return {
        "events": len(intervals),
        "steps": steps,
        "window_us_per_step": window / steps,
        "busy_us_per_step": busy / steps,
        "idle_us_per_step": (window - busy) / steps,
        "idle_gaps_us": {label: {"count": n, "us_per_step": t / steps}
                         for label, n, t in zip(labels, gaps, gap_us)},
        "kernels_us_per_step": {name: {"count": int(c), "us_per_step": t / steps}
                                for name, (c, t) in ranked[:top]},
        "other_kernels_us_per_step": sum(t for _, (_, t) in ranked[top:]) / steps,
        "idle_by_boundary_us_per_step": [
            {"before": before[:80], "after": after[:80], "count": int(c), "us_per_step": t / steps}
            for (before, after), (c, t) in sorted(boundaries.items(), key=lambda kv: -kv[1][1])[:10]],
    }


def summarize_trace(path: str, steps: int, top: int = 40) -> dict:
    return timeline(device_intervals(_load(path)), steps, top)


def diff(a: dict, b: dict, min_us: float = 2.0) -> list[str]:
    """Lines of B minus A, per step: window, busy, idle, then kernels that moved by min_us."""
    lines = []
    for key in ("window_us_per_step", "busy_us_per_step", "idle_us_per_step"):
        lines.append(f"{key:28s} {a[key]:10.1f} {b[key]:10.1f} {b[key] - a[key]:+10.1f}")
    ka, kb = a["kernels_us_per_step"], b["kernels_us_per_step"]
    moved = []
    for name in set(ka) | set(kb):
        ta = ka.get(name, {}).get("us_per_step", 0.0)
        tb = kb.get(name, {}).get("us_per_step", 0.0)
        if abs(tb - ta) >= min_us:
            moved.append((tb - ta, name, ta, tb))
    for delta, name, ta, tb in sorted(moved, reverse=True):
        lines.append(f"{name[:60]:60s} {ta:9.1f} {tb:9.1f} {delta:+9.1f}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", help="a trace, or with --diff two summary.json files")
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--diff", action="store_true")
    p.add_argument("--key", default="device_timeline",
                   help="the summary field holding the timeline (--diff)")
    args = p.parse_args()
    if args.diff:
        a, b = (json.load(open(path))[args.key] for path in args.paths)
        print("\n".join(diff(a, b)))
        return
    print(json.dumps(summarize_trace(args.paths[0], args.steps), indent=1))


if __name__ == "__main__":
    main()
