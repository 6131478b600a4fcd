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


def _start_evaluation(drafters: Path, out: Path, work: Path) -> subprocess.Popen:
    """eval_acceptance of ``drafters`` started, its output in files under ``work``'s parent (a
    pipe nobody reads while the other evaluation runs could fill up and stall it)."""
    env = dict(os.environ, SPECDEC_CPU_KV_CACHE_GIB="0.25", PYTHONPATH=str(ROOT))
    with open(out.with_suffix(".stdout"), "w") as stdout, \
            open(out.with_suffix(".stderr"), "w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "training.eval_acceptance", "--drafters", str(drafters),
             "--methods", "eagle3", "--per-category", "2", "--max-tokens", "32",
             "--categories", "chat,code", "--out", str(out), "--work", str(work)],
            cwd=ROOT, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
            text=True)


def _result(proc: subprocess.Popen, out: Path) -> dict:
    try:
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (out.with_suffix(".stdout").read_text()[-2000:]
                                  + out.with_suffix(".stderr").read_text()[-4000:])
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

    # Both evaluations at once, each an engine in processes of its own: on 2 cores much of
    # one start (imports, loading, one-threaded Python) overlaps the other's. What they
    # report (greedy drafts at fixed K, adaptive drafting off) does not depend on how busy
    # the cores are.
    runs = {name: (tmp_path / f"{name}.json", tmp_path / f"work_{name}")
            for name in ("shipped", "grown")}
    procs = {}
    try:
        for name, drafters in (("shipped", ASSETS_DIR), ("grown", grown)):
            procs[name] = _start_evaluation(drafters, *runs[name])
        want = _result(procs["shipped"], runs["shipped"][0])
        got = _result(procs["grown"], runs["grown"][0])
    finally:  # a failure of one leaves no other engine running
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for category in ("chat", "code"):
        assert got[category]["drafts"] == want[category]["drafts"], category
        assert got[category]["accepted_per_position"] == \
            want[category]["accepted_per_position"], category
        assert sum(want[category]["accepted_per_position"]) > 0  # drafts did land
