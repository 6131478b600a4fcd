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

Cost: writing an event as it happens (JSON encoding and a line-buffered write) took about
6 us of host time on the calling thread, and a speculative engine records 4-5 events a step
where plain decoding records 2. On the H200 at batch 1 (session 52, random 7.24B Llama,
every draft rejected) n-gram read 1.024 of plain decoding's ms/token with the log on in both
engines and 1.008 without it (two leases, not one run). So an event is now only appended
to a list in memory (under 1 us) and the events are written when the process exits, or
``HELD_EVENTS`` at a time once that many are held (a pause of about a second, every few
minutes of a busy engine). A process that is killed (SIGKILL) loses the events it held;
engines that shut down (``LLM`` going away, ``vllm serve`` stopped with Ctrl-C or SIGTERM)
write theirs. ``flush()`` writes them at once (tests). Time a bar with the log off
all the same, or with the benchmarks' ``step-log`` variant beside the default
(benchmarks/engine_variants.py).

Where: engine-core processes (scheduler and single-process workers share one). The path may
hold ``{pid}``, replaced by the process id, so that several engines can log side by side.
Off unless the variable is set; when off, ``record`` returns at its first test.
"""
from __future__ import annotations

import json
import multiprocessing.util
import os
import time

from specdec_plugin import envs

# Events held in memory before they are written (about 300 bytes each: 60 MB at most).
HELD_EVENTS = 200_000

_file = None
_path_checked = False
_events: list[tuple[float, str, dict]] = []


def _open():
    global _file, _path_checked
    _path_checked = True
    path = envs.step_log_path()
    if path:
        path = path.replace("{pid}", str(os.getpid()))
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        _file = open(path, "a")
        # Write what is held when this process exits. A multiprocessing finalizer runs both
        # where the interpreter exits normally (multiprocessing registers them with atexit)
        # and in an engine-core process that multiprocessing started, fork or spawn, once
        # its target returns (Process._bootstrap), where a forked child's atexit never does.
        multiprocessing.util.Finalize(None, flush, exitpriority=100)
    return _file


def enabled() -> bool:
    return (_file if _path_checked else _open()) is not None


def record(kind: str, **fields) -> None:
    """One event; ``fields`` must be JSON-serialisable (checked when written)."""
    f = _file if _path_checked else _open()
    if f is None:
        return
    _events.append((time.perf_counter(), kind, fields))
    if len(_events) >= HELD_EVENTS:
        flush()


def flush() -> None:
    """Write the held events, one JSON line each, in the order recorded."""
    global _events
    if _file is None or _file.closed or not _events:
        return
    held, _events = _events, []  # no copy; events recorded while writing wait for the next
    _file.write("".join(json.dumps({"t": round(t, 6), "kind": kind, **fields}) + "\n"
                        for t, kind, fields in held))
    _file.flush()


def _forget_in_forked_child() -> None:
    # A forked child would otherwise write into its parent's file (named by the parent's
    # pid), write the parent's held events a second time, and lose its own (multiprocessing
    # clears the inherited finalizers). It opens a file of its own at its first event.
    global _file, _path_checked
    _file, _path_checked = None, False
    _events.clear()


os.register_at_fork(after_in_child=_forget_in_forked_child)


def reset_for_tests() -> None:
    """Write what is held, close the file and read the variable again at the next event."""
    global _file, _path_checked
    if _file is not None:
        flush()
        _file.close()
    _events.clear()
    _file, _path_checked = None, False
