"""Where a worker's host waits for the device while serving (``SPECDEC_SYNC_DEBUG``, opt-in).

Why: under async scheduling the host prepares step t+1 while the device runs step t, and a
call that reads a device value on the host (``.item()``, ``.tolist()``, a copy to host memory
that is not pinned, a synchronize) stops that. On an H200 (issue 11, sessions 52-53) the
draft model's drafter launched its prefill-step kernels only after the target's prefill had
finished on the device, and speculative engines reached their batch's first tokens 5-14 ms
after plain decoding at batch 64; a trace shows that the host was late, not where it waited.
With the device's sync-debug mode on, each such call warns with the Python line that made it
(once per line: Python's default warning filter), which names the place.

Turned on after start-up (graph capture and the step-cost table synchronise on purpose), so
what it reports comes from serving steps.

What it cannot see: waits on events (``Event.synchronize``), which is how vLLM's async
scheduling and our runner wait for a step's output. On an H200 (issue 11, session 54, batch 64,
every draft rejected) no engine reported anything, plain decoding, the draft model, n-gram and
EAGLE-3 alike, and every one ran 1-5% slower with the mode on (torch checks each call). Nor does
it see a ``non_blocking`` copy from pageable host memory, which the driver may serialise with
the stream. Whatever holds back the late launches, it is not a call this mode reports.
"""
from __future__ import annotations

from specdec_plugin import envs
from specdec_plugin.log import init_logger

logger = init_logger(__name__)


def enable_after_startup(device_layer) -> str | None:
    """Sets the device's sync-debug mode from ``SPECDEC_SYNC_DEBUG``; returns the mode set
    (None: off, or the device has no such mode, which is logged)."""
    mode = envs.sync_debug()
    if mode is None:
        return None
    if not device_layer.set_sync_debug_mode(mode):
        logger.warning("specdec_plugin: SPECDEC_SYNC_DEBUG=%s: %s has no sync-debug mode; "
                       "nothing is reported", mode, device_layer.name)
        return None
    logger.warning("specdec_plugin: SPECDEC_SYNC_DEBUG=%s: from now on every call in this "
                   "worker that makes the host wait for the device %s, with the line it was "
                   "made from", mode, "warns" if mode == "warn" else "raises")
    return mode
