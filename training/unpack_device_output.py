"""Turn what the device run returned into the shipped assets.

    python training/unpack_device_output.py OUT_DIR [ASSETS_DIR]

Each ``<kind>.safetensors`` from the run carries its config JSON in its metadata; this writes
``<assets>/<kind>/`` with the weights and that config (``config.json``; for MTP
``mtp_config.json`` next to ``mtp_layer.safetensors``, since MTP ships only its own layer).
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from safetensors import safe_open

DEFAULT_ASSETS = Path(__file__).resolve().parent.parent / "specdec_plugin/assets/drafters"


def unpack(out_dir: Path, assets: Path) -> None:
    for kind in ("draft_model", "eagle", "eagle3", "mtp"):
        src = out_dir / f"{kind}.safetensors"
        if not src.exists():
            print(f"{kind}: no {src.name} in {out_dir}, skipped")
            continue
        with safe_open(str(src), "pt") as handle:
            config = json.loads(handle.metadata()["config"])
        dest = assets / kind
        dest.mkdir(parents=True, exist_ok=True)
        weights, config_name = ("mtp_layer.safetensors", "mtp_config.json") if kind == "mtp" \
            else ("model.safetensors", "config.json")
        shutil.copyfile(src, dest / weights)
        (dest / config_name).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        print(f"{kind}: {dest / weights} ({(dest / weights).stat().st_size} bytes)")


if __name__ == "__main__":
    unpack(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_ASSETS)
