"""PROJECT-MACHINE ONLY (this project's lent GPU machines, which have no package registry).

Re-split the device kit (../shared/devkit/build.sh output) into smaller parts.

Each device run carries the working tree plus one part under a 64 MiB cap (67.1 MB); with the
drafters in specdec_plugin/assets the tracked tree is ~35.4 MB (since 2026-11-26), so parts must
stay under ~29 MB (the kit's own are 55 MB; 36 MB ones failed at the cap, and so did a 31.5 MB
part once the tree had grown: the cap seems to count disk blocks, not bytes). This re-cuts the
vLLM archive and regroups the wheels into parts of at most --max-mb, each with the devkit's own
stage.sh and a PARTS count, exactly as build.sh lays them out.

    bash ../shared/devkit/build.sh /tmp/devkit && python scripts/devkit_resplit.py /tmp/devkit .devkit
    # then one device run per part, in order: carry .devkit/partN, run `bash .devkit/partN/stage.sh`
    # (in part1's run also `bash scripts/device_session.sh build-start`: the C++ build needs only
    # the image's torch and overlaps the staging; `build-wait` before the first job)

Staging is 9 short runs (5 kit parts, 4 SmolLM2 parts), about 1.5 minutes held if the build
overlaps it. Faster (sessions 57 and 58: 7 runs, about 140 s held from a bare machine): move
the four drafters' *.safetensors out of specdec_plugin/assets/drafters for the staging runs
only (the tree then weighs 16 MB), cut with --max-mb 42 here and in stage_smollm2.py, and
carry the small last kit part together with the first SmolLM2 part. Move the weights back
before the run that starts a job (EAGLE-3 and the other drafters need them) and check
`git status` shows no deleted file before any commit: a host lost in between loses them only
from the tree (they are tracked; `git checkout -- specdec_plugin/assets/drafters`).
Check `lease.counts` in each reply: some machines count held time in full, and a job sized
for a 67% machine does not fit the same budget on one of those (session 23).
Send part1's run alone and go on only once it succeeded: in session 29 it found no machine
(about 160 s of budget gone), and the runs queued behind it started a fresh machine without
part1, so the kit and the C++ build were missing when the job began.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import tempfile


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kit")
    parser.add_argument("out")
    parser.add_argument("--max-mb", type=float, default=29)
    parser.add_argument("--stage", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "devkit", "stage.sh"))
    args = parser.parse_args()
    limit = int(args.max_mb * 1e6)

    work = tempfile.mkdtemp()
    archive = os.path.join(work, "vllm.tar.xz")
    with open(archive, "wb") as out:
        for piece in sorted(glob.glob(os.path.join(args.kit, "part*", "vllm.tar.xz.part.*"))):
            with open(piece, "rb") as f:
                shutil.copyfileobj(f, out)
    # Re-cut the archive; suffixes sort in order, as stage.sh concatenates them by glob.
    pieces = []
    with open(archive, "rb") as f:
        for index in range(1000):
            chunk = f.read(min(limit, 30_000_000))
            if not chunk:
                break
            path = os.path.join(work, f"vllm.tar.xz.part.{index:03d}")
            with open(path, "wb") as out:
                out.write(chunk)
            pieces.append(path)
    wheels = sorted(glob.glob(os.path.join(args.kit, "part*", "whl", "*.whl")), key=os.path.getsize, reverse=True)

    parts: list[list[str]] = [[]]
    for item in pieces + wheels:  # first fit, archive pieces first
        for group in parts:
            if sum(map(os.path.getsize, group)) + os.path.getsize(item) <= limit:
                group.append(item)
                break
        else:
            parts.append([item])
    sizes = [round(sum(map(os.path.getsize, group)) / 1e6, 1) for group in parts]
    shutil.rmtree(args.out, ignore_errors=True)
    for number, group in enumerate(parts, 1):
        folder = os.path.join(args.out, f"part{number}")
        os.makedirs(os.path.join(folder, "whl"))
        for item in group:
            shutil.copy(item, os.path.join(folder, "whl") if item.endswith(".whl") else folder)
        shutil.copy(args.stage, folder)
        with open(os.path.join(folder, "PARTS"), "w") as f:
            f.write(str(len(parts)))
    shutil.rmtree(work)
    print(len(parts), "parts:", sizes, "MB")


if __name__ == "__main__":
    main()
