"""What the host was doing while the GPU sat idle: device gaps attributed to host activity.

``trace_steps.py`` says how long the device idles and between which kernels. This answers the
next question, from a trace that profiled both sides (``profile_engine.py`` without
``--device-only`` writes ``trace.json.gz``, with vLLM's runner phases as ranges):

- for every device gap of ``--min-us`` or more, the launch that ended it: the host call whose
  correlation id the first device event after the gap carries (a graph launch, a kernel
  launch, a copy), how late that call was issued (its start minus the gap's start) and which
  ranges enclosed it;
- the host time inside each gap, split by the innermost range open on the launching thread
  (vLLM's ``gpu_model_runner: ...`` phases, our scheduler's ``specdec: ...`` ranges, or
  ``(no range)``) and, separately, by the top-level host operator running (``aten::...``,
  ``cudaEventSynchronize``, ...; time with no operator running is Python);
- totals per step (``--steps``: the decode steps of the profiled call).

The profiler slows the host more than the device, so gaps here are longer than unprofiled:
read where the host time goes, not how much there is.

    python benchmarks/gap_host_activity.py TRACE.json.gz --steps 128 [--min-us 100]
"""
from __future__ import annotations

import argparse
import bisect
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/: trace_steps
from trace_steps import DEVICE_CATEGORIES, _load  # noqa: E402

HOST_OPS = ("cpu_op", "cuda_runtime", "cuda_driver")
RANGES = ("user_annotation",)
UNKNOWN_LAUNCH = "(launch not in trace)"


def _device_events(events):
    out = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e.get("name", "?"),
            (e.get("args") or {}).get("correlation"))
           for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES]
    out.sort()
    return out


def device_gaps(device, min_us: float):
    """(gap_start, gap_end, first_event_after) for idle stretches of at least min_us."""
    gaps = []
    cur_end = device[0][1]
    for ev in device[1:]:
        start, end = ev[0], ev[1]
        if start - cur_end >= min_us:
            gaps.append((cur_end, start, ev))
        cur_end = max(cur_end, end)
    return gaps


class HostThread:
    """One host thread's ranges and operators, for overlap queries."""

    def __init__(self):
        self.ranges: list[tuple[float, float, str]] = []
        self.ops: list[tuple[float, float, str]] = []

    def finish(self):
        self.ranges.sort()
        # Top-level operators only: an op inside another op is part of its parent's time.
        ops, top, end = sorted(self.ops, key=lambda o: (o[0], -o[1])), [], -1.0
        for op in ops:
            if op[0] >= end:
                top.append(op)
                end = op[1]
        self.ops = top
        self._op_starts = [o[0] for o in self.ops]

    def innermost_range(self, t: float) -> str:
        best = None
        for start, end, name in self.ranges:  # ranges are few (tens per step)
            if start > t:
                break
            if end > t and (best is None or start >= best[0]):
                best = (start, end, name)
        return best[2] if best else "(no range)"

    def enclosing_ranges(self, t: float) -> list[str]:
        return [name for start, end, name in self.ranges if start <= t < end]

    def split_by_range(self, lo: float, hi: float, out: dict) -> None:
        """Add [lo, hi) to ``out`` by innermost open range, cut at every range boundary."""
        cuts = sorted({lo, hi} | {x for s, e, _ in self.ranges for x in (s, e) if lo < x < hi})
        for a, b in zip(cuts, cuts[1:]):
            out[self.innermost_range((a + b) / 2)] += b - a

    def split_by_op(self, lo: float, hi: float, out: dict) -> None:
        i = max(bisect.bisect_left(self._op_starts, lo) - 1, 0)
        covered = 0.0
        while i < len(self.ops) and self.ops[i][0] < hi:
            start, end, name = self.ops[i]
            overlap = min(end, hi) - max(start, lo)
            if overlap > 0:
                out[name] += overlap
                covered += overlap
            i += 1
        out["(python: no operator)"] += (hi - lo) - covered


def attribute(events, steps: int, min_us: float, top: int = 25) -> dict:
    device = _device_events(events)
    if not device:
        return {"gaps": 0}
    launches = {}
    threads: dict[tuple, HostThread] = defaultdict(HostThread)
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, key = e.get("cat"), (e.get("pid"), e.get("tid"))
        start = float(e["ts"])
        span = (start, start + float(e.get("dur", 0.0)), e.get("name", "?"))
        if cat in RANGES:
            threads[key].ranges.append(span)
        elif cat in HOST_OPS:
            threads[key].ops.append(span)
            corr = (e.get("args") or {}).get("correlation")
            if cat in ("cuda_runtime", "cuda_driver") and corr is not None:
                launches[corr] = (key, span)
    for thread in threads.values():
        thread.finish()
    by_range: dict[str, float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    ended_by: dict[tuple, list] = defaultdict(lambda: [0, 0.0, 0.0])
    total = 0.0
    gaps = device_gaps(device, min_us)
    for gap_start, gap_end, first in gaps:
        total += gap_end - gap_start
        launch = launches.get(first[3])
        if launch is None:  # its lateness is unknown (None below)
            entry = ended_by[(UNKNOWN_LAUNCH, first[2][:60], "")]
            entry[0] += 1
            entry[1] += gap_end - gap_start
            continue
        key, (l_start, _, l_name) = launch
        thread = threads[key]
        # The launching thread's time from the gap's start to the late launch.
        if l_start > gap_start:
            thread.split_by_range(gap_start, l_start, by_range)
            thread.split_by_op(gap_start, l_start, by_op)
        scope = " > ".join(thread.enclosing_ranges(l_start)[-2:]) or "(no range)"
        entry = ended_by[(l_name, first[2][:60], scope)]
        entry[0] += 1
        entry[1] += gap_end - gap_start
        entry[2] += max(l_start - gap_start, 0.0)

    def ranked(d):
        return {k: round(v / steps, 1) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]}

    return {
        "steps": steps,
        "min_gap_us": min_us,
        "gaps": len(gaps),
        "gap_us_per_step": round(total / steps, 1),
        "host_time_in_gaps_by_range_us_per_step": ranked(by_range),
        "host_time_in_gaps_by_operator_us_per_step": ranked(by_op),
        "gaps_ended_by": [
            {"launch": l, "first_device_event": d, "ranges": s, "count": c,
             "gap_us_per_step": round(g / steps, 1),
             "launch_late_by_us_mean": None if l == UNKNOWN_LAUNCH else round(late / c, 1)}
            for (l, d, s), (c, g, late) in sorted(ended_by.items(), key=lambda kv: -kv[1][1])[:top]],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--min-us", type=float, default=100.0)
    args = p.parse_args()
    print(json.dumps(attribute(_load(args.trace), args.steps, args.min_us), indent=1))


if __name__ == "__main__":
    main()
