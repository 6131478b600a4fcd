"""A line per engine-step event, written to a file (opt-in diagnostics, ``SPECDEC_STEP_LOG``).

Why: on the H100 (session 27) EAGLE-3's timed runs at batch 64 took 0.99, 1.02, 1.72, 1.29
and 1.32 s where plain decoding's took 0.95-0.97 s, and a device profile of steady decoding
showed no such cost: something stalls some runs for 0.3-0.7 s. A benchmark's wall times
cannot say which step stalled or what it was doing; this log can.

What: each event is one JSON line with the host clock (``t``, ``time.perf_counter`` seconds,
comparable within one process), its kind and a few fields:
- ``sched``: the scheduler built a step (``build_ms``), with its requests, tokens, new
  requests and chosen draft length;
- ``result``: that step's result reached the scheduler;
- ``exec`` / ``sample``: the runner's ``execute_model`` / ``sample_tokens`` host time;
- ``draft``: how the drafter ran (``deferred``, a graph ``replay``, or ``eager``) and for
  how long on the host; ``flush``: a deferred-sync flush and its kept tokens.
Host times only: under async scheduling a call returns once its work is queued, so a long
``exec`` is the host stalling, and a long gap between ``result`` events with short calls
is the device (or a wait on it).

Cost: an event is about 5-7 us of host time on the calling thread (JSON encoding and a
line-buffered write), and a speculative engine writes 4-5 a step where plain decoding writes
2. On the H200 at batch 1 (session 52, random 7.24B Llama, every draft rejected) n-gram read
1.024 of plain decoding's ms/token with the log on in both engines and 1.008 without it (two
leases, not one run): time a bar with the log off, and take logs in runs of their own or
with the benchmarks' ``step-log`` variant beside the default (benchmarks/engine_variants.py).

Where: engine-core processes (scheduler and single-process workers share one). The path may
hold ``{pid}``, replaced by the process id, so that several engines can log side by side.
Off unless the variable is set; when off, ``record`` returns at its first test.
"""
from __future__ import annotations

import json
import os
import time

from specdec_plugin import envs

_file = None
_path_checked = False


def _open():
    global _file, _path_checked
    _path_checked = True
    path = envs.step_log_path()
    if path:
        path = path.replace("{pid}", str(os.getpid()))
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        # Line-buffered: an engine may be killed at shutdown, and a buffered tail would be lost.
        _file = open(path, "a", buffering=1)
    return _file


def enabled() -> bool:
    return (_file if _path_checked else _open()) is not None


def record(kind: str, **fields) -> None:
    """One event; ``fields`` must be JSON-serialisable."""
    f = _file if _path_checked else _open()
    if f is None:
        return
    f.write(json.dumps({"t": round(time.perf_counter(), 6), "kind": kind, **fields}) + "\n")


def reset_for_tests() -> None:
    """Close the file and read the variable again at the next event."""
    global _file, _path_checked
    if _file is not None:
        _file.close()
    _file, _path_checked = None, False
