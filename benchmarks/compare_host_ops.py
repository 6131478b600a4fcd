"""Two engines' host time for the same work: per-operator host durations inside one range.

``gap_host_activity.py`` says what the host was doing while the device waited. When two
engines launch the same kernels (a plain engine and a speculative one, both prefilling the
same batch) but one's range lasts longer, this says whether one operator grew or all of them
did: for the n-th occurrence of ``--range`` in each trace (``profile_engine.py``'s
``trace.json.gz``, host and device activity), the range's host duration, the device time of
the kernels launched inside it, and each host operator's median duration in both, with the
median of their ratios (B over A).

    python benchmarks/compare_host_ops.py A/trace.json.gz B/trace.json.gz \
        [--range "gpu_model_runner: forward"] [--occurrence 0] [--top 12]

Session 55 (H200, batch 64, 192-token prompts): in the draft model's engine the target's
prefill forward launched the same 385 kernels (21.1 ms of device time) as plain decoding's,
but its host took 31.8 ms instead of 21.9, every operator 1.3-1.7x slower (median 1.61)
inside that window and about 1.1x outside it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/: trace_steps
from trace_steps import _load  # noqa: E402

DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCHES = ("cuda_runtime", "cuda_driver")


def range_window(events: list[dict], name: str, occurrence: int) -> tuple[float, float]:
    found = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
                   for e in events
                   if e.get("cat") == "user_annotation" and e.get("name") == name)
    if occurrence >= len(found):
        raise SystemExit(f"range {name!r}: {len(found)} occurrences, asked for #{occurrence}")
    return found[occurrence]


def window_summary(events: list[dict], start: float, end: float) -> dict:
    """Host operators' durations, launches and the device time they started, in [start, end]."""
    inside = [e for e in events if e.get("ph") == "X" and start <= float(e["ts"]) <= end]
    ops: dict[str, list[float]] = defaultdict(list)
    for e in inside:
        if e.get("cat") == "cpu_op":
            ops[e["name"][:60]].append(float(e["dur"]))
    launched = {e["args"].get("correlation") for e in inside if e.get("cat") in LAUNCHES}
    device = [e for e in events if e.get("cat") in DEVICE
              and e.get("args", {}).get("correlation") in launched]
    return {"host_us": end - start, "launches": len(launched), "kernels": len(device),
            "device_us": sum(float(e["dur"]) for e in device), "ops": ops}


def compare(a: dict, b: dict, top: int) -> list[str]:
    lines = [f"{'':<8}{'host ms':>9}{'launches':>10}{'device ms':>11}"]
    for label, s in (("A", a), ("B", b)):
        lines.append(f"{label:<8}{s['host_us'] / 1e3:>9.2f}{s['launches']:>10}"
                     f"{s['device_us'] / 1e3:>11.2f}")
    common = [k for k in a["ops"] if k in b["ops"] and len(a["ops"][k]) >= 3
              and len(b["ops"][k]) >= 3]
    ratios = [statistics.median(b["ops"][k]) / statistics.median(a["ops"][k]) for k in common]
    if ratios:
        lines.append(f"median over {len(common)} operators of B/A per-call medians: "
                     f"{statistics.median(ratios):.3f}")
    lines.append(f"{'calls A':>8}{'med A us':>10}{'med B us':>10}{'B/A':>7}  operator")
    for k in sorted(common, key=lambda k: -sum(a["ops"][k]))[:top]:
        ma, mb = statistics.median(a["ops"][k]), statistics.median(b["ops"][k])
        lines.append(f"{len(a['ops'][k]):>8}{ma:>10.1f}{mb:>10.1f}{mb / ma:>7.2f}  {k}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace_a")
    p.add_argument("trace_b")
    p.add_argument("--range", default="gpu_model_runner: forward")
    p.add_argument("--occurrence", type=int, default=0)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()
    summaries = []
    for path in (args.trace_a, args.trace_b):
        events = _load(path)
        summaries.append(window_summary(events, *range_window(events, args.range,
                                                              args.occurrence)))
    print("\n".join(compare(*summaries, args.top)))


if __name__ == "__main__":
    main()
