"""SPECDEC_STEP_LOG (specdec_plugin/step_log.py): off unless set, one JSON line per event,
``{pid}`` replaced by the process id. The engine's use is tested in
tests/test_deferred_sync_engine.py."""
from __future__ import annotations

import json
import os
import random

from specdec_plugin import step_log
from tests.environ import environ


def test_off_unless_the_variable_is_set(tmp_path):
    with environ(SPECDEC_STEP_LOG=""):
        step_log.reset_for_tests()
        try:
            assert not step_log.enabled()
            step_log.record("exec", ms=1.0)  # a no-op
        finally:
            step_log.reset_for_tests()
    assert list(tmp_path.iterdir()) == []


def test_one_line_per_event_in_a_file_named_by_pid(tmp_path):
    values = [round(random.uniform(0.1, 50.0), 3) for _ in range(5)]
    with environ(SPECDEC_STEP_LOG=str(tmp_path / "sub" / "steps-{pid}.jsonl")):
        step_log.reset_for_tests()
        try:
            assert step_log.enabled()
            for i, ms in enumerate(values):
                step_log.record("draft", path="replay", ms=ms, tokens=i)
        finally:
            step_log.reset_for_tests()
    with open(tmp_path / "sub" / f"steps-{os.getpid()}.jsonl") as f:
        events = [json.loads(line) for line in f]
    assert [e["ms"] for e in events] == values
    assert [e["tokens"] for e in events] == list(range(5))
    assert all(e["kind"] == "draft" and e["path"] == "replay" for e in events)
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)
