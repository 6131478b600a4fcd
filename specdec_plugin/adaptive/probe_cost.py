"""What the controller's probes cost in wall time, from the intervals between step results.

Why: the probe budget (``controller.first_probe_every``) spaces probes so that their extra time
is a set share of the plain steps' time, and it prices a probe from the cost table: one step
verifying one draft per request against a plain step. A probe costs more than that step. On
the H200 at batch 64 (session 48, every draft rejected, both engines logging steps) the four
result intervals from a probe's drafting step on took 1.7 ms (EAGLE) and 3.5 ms (suffix) more
than four plain steps (medians; means 2.6 and 4.2), where a plain step took 5.15 ms:
- the drafting step runs the proposer (suffix's host tree for 64 requests: its step took twice
  a plain one), and the step timer leaves that step out of the table's corrections on purpose
  (a cost of changing regime, ``step_timing.py``);
- the verifying step verifies twice the tokens;
- under async scheduling the step after it waits for the verification's result before its
  inputs can be prepared (how many drafts were accepted), so the pipeline drains once.
The table saw a fraction of that, so probes came 2-10x more often than the budget meant.

How: each step's result interval (``StepTimer``'s ``last_interval``), in schedule order. A probe
opens a window of ``window`` steps, its drafting step and the ones after; the window's extra
time over as many plain steps at the same batch size (the median of the recent plain
intervals) is the probe's cost, in plain steps. Only steady windows count: back to back, no
request arriving or leaving, the same batch size throughout; a probe at a prefill step (new
requests) is not measured. The controller reads the median of the last ``history`` probes at
its batch size (``extra_steps``) in place of the table's price where one has been measured
(``SPECDEC_ADAPTIVE_PROBE_COST=observed``, the CUDA default since session 54; ``table``, the
default elsewhere, prices probes by the table alone). On the H200 at batch 64 with every draft
rejected (session 54, 16 paired runs) it left one probe a 128-token run where the table's
price left two (EAGLE-3) or three (suffix), and suffix's decode went from 1.011 to 1.001 of
plain decoding's.

Pure: no clock, no logging.
"""
from __future__ import annotations

import statistics
from collections import deque

# Steps from a probe's drafting step on: drafting, verifying, the drained step, and one more
# (on the H200 the median extra settled from four steps on: 2.16, 1.89, 1.74, 1.67, 1.85 ms
# over windows of 2-6 for EAGLE).
PROBE_WINDOW = 4
# Probes whose cost is kept per batch size, and plain intervals kept per batch size.
HISTORY = 8
PLAIN_SAMPLES = 32
# Plain intervals needed at a batch size before a probe there is priced.
MIN_PLAIN = 8
# Batch sizes remembered (serving moves through many): past this, all are forgotten.
MAX_BATCH_SIZES = 64


class ProbeCost:
    def __init__(self, window: int = PROBE_WINDOW, history: int = HISTORY,
                 plain_samples: int = PLAIN_SAMPLES, min_plain: int = MIN_PLAIN):
        if window < 1 or history < 1 or min_plain < 1 or plain_samples < min_plain:
            raise ValueError("ProbeCost needs window, history, min_plain >= 1 and "
                             "plain_samples >= min_plain")
        self.window = window
        self.history = history
        self.plain_samples = plain_samples
        self.min_plain = min_plain
        self._plain: dict[int, deque[float]] = {}
        self._extras: dict[int, deque[float]] = {}
        # The open window: (batch size, intervals so far), or None.
        self._open: tuple[int, list[float]] | None = None

    def step(self, num_reqs: int, seconds: float | None, steady: bool, plain: bool,
             probe: bool) -> None:
        """One step's result, in schedule order. ``seconds``: the interval its result closed
        (None: not timed); ``steady``: scheduled back to back, with no request arriving;
        ``plain``: it neither verified nor drafted; ``probe``: its drafts were a probe."""
        timed = seconds is not None and seconds > 0 and steady
        if self._open is not None:
            n, intervals = self._open
            if not timed or num_reqs != n or probe:
                self._open = None  # not a steady window: nothing learned
            else:
                intervals.append(seconds)
                if len(intervals) == self.window:
                    self._open = None
                    self._close(n, intervals)
                return
        if probe:
            self._open = (num_reqs, [seconds]) if timed else None
        elif plain and timed:
            self._keep(self._plain, num_reqs, seconds, self.plain_samples)

    def _close(self, num_reqs: int, intervals: list[float]) -> None:
        plain = self._plain.get(num_reqs)
        if plain is None or len(plain) < self.min_plain:
            return
        step = statistics.median(plain)
        self._keep(self._extras, num_reqs, sum(intervals) / step - len(intervals), self.history)

    @staticmethod
    def _keep(table: dict[int, deque[float]], num_reqs: int, value: float, size: int) -> None:
        if num_reqs not in table and len(table) >= MAX_BATCH_SIZES:
            table.clear()
        table.setdefault(num_reqs, deque(maxlen=size)).append(value)

    def extra_steps(self, num_reqs: int) -> float | None:
        """A probe's extra time at ``num_reqs`` requests, in plain steps (never below 0): the
        median of the last probes measured there; None where none was."""
        extras = self._extras.get(num_reqs)
        if not extras:
            return None
        return max(statistics.median(extras), 0.0)
