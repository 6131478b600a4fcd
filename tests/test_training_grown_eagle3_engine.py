"""A grown EAGLE-3 head serves, through vLLM on our platform, exactly as the head it grew from.

stage_train can give a trained head a second decoder layer (``--eagle3-layers``) and a fourth
target tap (``--eagle3-taps``), both starting as no-ops (zero output projections, zero fc
columns), so that training starts from the head's function. That only holds if vLLM reads
the grown file as training writes it: ``layers.1.*`` after ``midlayer.*``, and the taps
gathered in layer order into the fc's columns. Greedy drafts are a sharp check: every
accepted count per draft position must equal the shipped head's, on the same prompts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.model]

ROOT = Path(__file__).resolve().parent.parent


def _evaluate(drafters: Path, out: Path, work: Path) -> dict:
    env = dict(os.environ, SPECDEC_CPU_KV_CACHE_GIB="0.25", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "training.eval_acceptance", "--drafters", str(drafters),
         "--methods", "eagle3", "--per-category", "2", "--max-tokens", "32",
         "--categories", "chat,code", "--out", str(out), "--work", str(work)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())["methods"]["eagle3"]["categories"]


def test_grown_head_drafts_exactly_as_the_shipped_one(tmp_path):
    from specdec_plugin.models.drafters import ASSETS_DIR
    from training.drafter_io import load_for_resume, save_drafter

    head = load_for_resume(ASSETS_DIR, "eagle3", None, log=lambda m: None)
    head.add_taps((2, 15, 27, 30))
    head.grow(2)
    grown = tmp_path / "grown"
    grown.mkdir()
    save_drafter("eagle3", head, grown / "eagle3.safetensors")

    want = _evaluate(ASSETS_DIR, tmp_path / "shipped.json", tmp_path / "work_shipped")
    got = _evaluate(grown, tmp_path / "grown.json", tmp_path / "work_grown")
    for category in ("chat", "code"):
        assert got[category]["drafts"] == want[category]["drafts"], category
        assert got[category]["accepted_per_position"] == \
            want[category]["accepted_per_position"], category
        assert sum(want[category]["accepted_per_position"]) > 0  # drafts did land
