"""SPECDEC_STEP_LOG (specdec_plugin/step_log.py): off unless set, one JSON line per event,
``{pid}`` replaced by the process id. The engine's use is tested in
tests/test_deferred_sync_engine.py."""
from __future__ import annotations

import json
import os
import random

import pytest

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


def test_events_are_held_until_written(tmp_path, monkeypatch):
    # Appending to a list, not encoding and writing, is all an event costs the engine's step
    # (step_log.py: the write took about 6 us an event, enough to show in a batch-1 ratio).
    cap = random.randrange(3, 9)
    monkeypatch.setattr(step_log, "HELD_EVENTS", cap)
    path = tmp_path / "steps-{pid}.jsonl"
    written = tmp_path / f"steps-{os.getpid()}.jsonl"
    with environ(SPECDEC_STEP_LOG=str(path)):
        step_log.reset_for_tests()
        try:
            for i in range(cap - 1):
                step_log.record("exec", ms=float(i), tokens=i)
            assert written.read_text() == ""  # held
            step_log.record("exec", ms=float(cap - 1), tokens=cap - 1)  # the cap: written
            assert len(written.read_text().splitlines()) == cap
            step_log.record("sample", ms=0.5)
            step_log.flush()
            lines = [json.loads(line) for line in written.read_text().splitlines()]
        finally:
            step_log.reset_for_tests()
    assert [e["kind"] for e in lines] == ["exec"] * cap + ["sample"]
    assert [e.get("tokens") for e in lines[:cap]] == list(range(cap))


def _record_and_return(path: str, count: int) -> None:
    # An engine-core process's life in short: events recorded, then its target returns
    # without anyone calling flush.
    os.environ["SPECDEC_STEP_LOG"] = path
    step_log.reset_for_tests()
    for i in range(count):
        step_log.record("result", tokens=i)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_process_started_by_multiprocessing_writes_its_events_at_exit(tmp_path, start_method):
    # vLLM starts engine cores with multiprocessing; a forked child ends in os._exit, where
    # atexit does not run, so the log relies on multiprocessing's own exit finalizers.
    import multiprocessing

    count = random.randrange(5, 50)
    path = str(tmp_path / "steps-{pid}.jsonl")
    context = multiprocessing.get_context(start_method)
    with environ(SPECDEC_STEP_LOG=path):
        step_log.reset_for_tests()
        try:
            # This process logs too, and still holds its event when the child starts: a
            # forked child must neither write it again nor write into this process's file.
            step_log.record("exec", ms=1.0)
            child = context.Process(target=_record_and_return, args=(path, count))
            child.start()
            child.join(60)
        finally:
            step_log.reset_for_tests()
    assert child.exitcode == 0
    with open(tmp_path / f"steps-{child.pid}.jsonl") as f:
        events = [json.loads(line) for line in f]
    assert [e["tokens"] for e in events] == list(range(count))
    with open(tmp_path / f"steps-{os.getpid()}.jsonl") as f:
        assert [json.loads(line)["kind"] for line in f] == ["exec"]
