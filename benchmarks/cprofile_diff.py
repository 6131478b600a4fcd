"""Which Python functions one engine spends more host time in than another, per engine step.

Reads two ``profile_engine.py --host-only`` (or full) output folders, each with its
``cprofile.prof`` and the profiled call's engine step count in ``summary.json``
(``cprofile_steps``), and prints, per step, the functions whose own time (``tottime``) differs
most, then those whose cumulative time differs most: where a speculative engine's step that
drafts nothing costs the host more than a plain one's. cProfile slows every Python call, so
read where the extra time goes and its order of size, not the exact microseconds.

    python benchmarks/cprofile_diff.py DIR_PLAIN DIR_METHOD [--top 40]
"""
from __future__ import annotations

import argparse
import json
import os
import pstats


def load(folder: str) -> tuple[dict, int]:
    """{(file, line, function): (own s, cumulative s, calls)} and the profiled call's steps."""
    with open(os.path.join(folder, "summary.json")) as f:
        steps = int(json.load(f)["cprofile_steps"])
    stats = pstats.Stats(os.path.join(folder, "cprofile.prof")).stats  # type: ignore[attr-defined]
    return {key: (tt, ct, nc) for key, (cc, nc, tt, ct, callers) in stats.items()}, steps


def short(key) -> str:
    path, line, name = key
    for marker in ("site-packages/", "/specdec_plugin/", "/benchmarks/"):
        if marker in path:
            path = path[path.index(marker):].lstrip("/").removeprefix("site-packages/")
            break
    return f"{path}:{line}({name})" if line else name


def diff_rows(a: dict, a_steps: int, b: dict, b_steps: int, column: int) -> list[tuple]:
    """(per-step ms in b - per-step ms in a, a's, b's, b's calls per step, key)."""
    rows = []
    for key in set(a) | set(b):
        va = a.get(key, (0.0, 0.0, 0))[column] / a_steps * 1e3
        vb = b.get(key, (0.0, 0.0, 0))[column] / b_steps * 1e3
        calls = b.get(key, (0.0, 0.0, 0))[2] / b_steps
        rows.append((vb - va, va, vb, calls, key))
    rows.sort(key=lambda r: -abs(r[0]))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", help="profile_engine.py output folder (e.g. plain decoding)")
    p.add_argument("other", help="the folder to compare with it (e.g. a speculative method)")
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args()
    a, a_steps = load(args.base)
    b, b_steps = load(args.other)
    total_a = sum(v[0] for v in a.values()) / a_steps * 1e3
    total_b = sum(v[0] for v in b.values()) / b_steps * 1e3
    print(f"steps: {a_steps} / {b_steps}; profiled host time per step: {total_a:.3f} / "
          f"{total_b:.3f} ms ({total_b - total_a:+.3f})")
    for title, column in (("own time (tottime)", 0), ("cumulative time", 1)):
        print(f"\n== {title}, ms per step: other - base, base, other, other's calls per step")
        for d, va, vb, calls, key in diff_rows(a, a_steps, b, b_steps, column)[:args.top]:
            print(f"  {d:+8.3f} {va:8.3f} {vb:8.3f} {calls:7.1f}  {short(key)}")


if __name__ == "__main__":
    main()
