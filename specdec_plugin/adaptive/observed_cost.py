"""The start-up cost table, corrected by the step times the engine observes.

Why: ``cost_model.py`` predicts a step's time from forward passes timed at engine start, and
those timings can be wrong about what a serving step really costs. On an H100 (issue 11's
real-prompt run) a speculative step whose requests drafted different numbers of tokens was not
a "uniform decode" batch for vLLM, so it ran piecewise graphs with attention eager and cost
about twice a plain step, while the table, timed on uniform full-graph steps, said 1.1x: the
controller kept drafting and adaptive n-gram ran 1.8x slower than plain decoding. On the CPU,
load from other processes moves step times the same way.

How: for each draft length k, the ratio observed/predicted of the steps that verified k drafts
(``observe``); the factor is the median of that length's last ``window`` ratios (in log space,
so that between two middle values it takes their geometric mean). A median, not a mean: on an
H100 (session 23, BENCHMARKS.md) the intervals the scheduler sees include some of 3-5x a
step (34 ms where steps took 7-11 ms), under the stall cut below, and a fading mean of log
ratios (the estimator before) followed them: the factor of 4-token steps swung between 0.93
and 1.48 within one benchmark run, and adaptive n-gram with the correction lost its batch-1
win on code. Up to half of a window can be such intervals before the median moves.

A median has its own failure: where a length's step times fall in two groups of similar size,
it jumps from one group to the other as the window's mix shifts by a step or two. On the H100
(session 24, suffix at batch 4-64) the 1-token factor went 1.25 -> 0.88 -> 1.27 -> 0.87 -> 1.39
-> 0.93 -> 1.36 -> 0.94 -> 1.37 -> 0.95 -> 1.21 -> 0.86 -> 1.19 in one run, a move every nine
or so steps, each one changing what drafting is predicted to cost by a third. Throughput
follows the mean step time, not the median. ``estimator="iqm"`` (opt-in,
``SPECDEC_ADAPTIVE_OBSERVED_ESTIMATOR=iqm``, not yet measured on a GPU) takes the mean of the
middle half of the window instead: a quarter of the window at either end is dropped (the
stalls above), and two groups are averaged rather than chosen between.
``step_time(n, k)`` is the table's prediction times that length's factor. Only ratios between
lengths change a decision (``policy.py`` compares tokens per second across k), so what matters
is getting each length's factor relative to the others right:

- A length needs ``min_observations`` before its own factor is used: one step's time is noisy.
- A drafting length not observed yet borrows from the nearest observed drafting length. The
  surprise this corrects is mostly a property of drafting at all (a batch that is not a uniform
  decode, the proposer's and rejection sampler's host work), not of how many tokens are drafted;
  borrowing k = 0's factor instead would make every unobserved length look cheaper than the
  observed one, and the controller would walk through every length, paying for each, before
  believing what the first one showed. Where no drafting length has been observed (the engine
  has only run plain steps), k = 0's factor: host load seen on plain steps carries over, and
  drafting is neither favoured nor penalised.
- k = 0 not observed yet: the table's plain step (factor 1) where drafting was seen to cost
  more than the table says, and the shortest observed drafting length's factor where it was
  seen to cost less. Not simply a drafting length's factor: the gap between drafting and plain
  steps is exactly what the correction must learn, and a plain step is observed as soon as
  drafting looks too expensive for the policy to pick it, so a dearer drafting step settles the
  question within a few steps. A cheaper one would not (the policy then keeps drafting and
  never runs the plain step that would tell), so it is read as the whole table being off in
  scale (measured under host load, or the fallback table's arbitrary units), which tilts
  nothing. An unknown is never allowed to make drafting look better than the table says.
- Factors are clamped to [``min_factor``, ``max_factor``]: a correction, not a new model. An
  observation whose ratio is beyond ``discard_ratio`` is not a step's cost (an idle gap the
  scheduler could not see, a stall): it is dropped.
- Evidence of a length is replaced only when that length is observed again, so a length
  visited rarely (the controller's one-token probes while it is off) keeps what its last visits
  showed.

One factor per length, not per (batch size, length): the batch size moves slowly in serving and
the window follows it; lengths are few and each is visited often enough to learn.

Pure: no clock, no logging. ``changes`` reports the factors that moved by more than a fraction
since last reported, for the controller to log.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from specdec_plugin.adaptive.policy import StepCost


@dataclass(frozen=True)
class ObservedCostSettings:
    # The factor of a length is the median (or "iqm": the mean of the middle half) of its last
    # this many ratios, in log space.
    window: int = 16
    estimator: str = "median"
    min_observations: int = 8
    min_factor: float = 0.5
    max_factor: float = 5.0
    # An observed/predicted ratio above this is not a step's cost: dropped.
    discard_ratio: float = 10.0


def interquartile_mean(values) -> float:
    """The mean of the middle half: a quarter of the values (rounded down) dropped at each end."""
    ordered = sorted(values)
    cut = len(ordered) // 4
    return statistics.fmean(ordered[cut:len(ordered) - cut])


ESTIMATORS = {"median": statistics.median, "iqm": interquartile_mean}


def check_estimator(name: str, label: str = "observed-cost estimator ") -> None:
    """Refuse an estimator name that ``ESTIMATORS`` lacks; ``label`` says where it came from
    (adaptive/config.py names the environment variable)."""
    if name not in ESTIMATORS:
        raise ValueError(f"{label}{name!r}: expected one of {sorted(ESTIMATORS)}")


class ObservedCost:
    """A ``StepCost`` (policy.py): ``table``'s prediction times a learned factor per length."""

    def __init__(self, table: StepCost, settings: ObservedCostSettings | None = None):
        self.table = table
        self.settings = settings or ObservedCostSettings()
        check_estimator(self.settings.estimator)
        # Per length: the last ``window`` log ratios, and the number of observations.
        self._log_ratios: dict[int, deque[float]] = {}
        self.observations: dict[int, int] = {}
        # The factor last reported by ``changes``, per length (1.0: the table).
        self._reported: dict[int, float] = {}
        # Each length's own factor until its window changes: ``step_time(n, k)`` reads the
        # factors of every length up to k, and the policy asks for every k each step.
        self._own_factors: dict[int, float] = {}
        # Corrected step times by batch size, each a running maximum over lengths 0..k (see
        # step_time); the policy reads every length each step, and only an observation
        # changes them.
        self._corrected: dict[int, list[float]] = {}

    def observe(self, num_reqs: int, k: int, seconds: float) -> bool:
        """A step of ``num_reqs`` requests that verified ``k`` drafts each took ``seconds``.
        Returns whether it was used (False: a ratio beyond ``discard_ratio``, or no time)."""
        predicted = self.table.step_time(num_reqs, k)
        if seconds <= 0 or predicted <= 0:
            return False
        ratio = seconds / predicted
        if ratio > self.settings.discard_ratio:
            return False
        if k not in self._log_ratios:
            self._log_ratios[k] = deque(maxlen=self.settings.window)
        self._log_ratios[k].append(math.log(ratio))
        self._own_factors.pop(k, None)
        self._corrected.clear()
        self.observations[k] = self.observations.get(k, 0) + 1
        return True

    def learned(self, k: int) -> bool:
        return self.observations.get(k, 0) >= self.settings.min_observations

    def _own_factor(self, k: int) -> float:
        factor = self._own_factors.get(k)
        if factor is None:
            s = self.settings
            factor = math.exp(ESTIMATORS[s.estimator](self._log_ratios[k]))
            factor = self._own_factors[k] = min(max(factor, s.min_factor), s.max_factor)
        return factor

    def factor(self, k: int) -> float:
        if self.learned(k):
            return self._own_factor(k)
        drafting = [j for j in self.observations if j > 0 and self.learned(j)]
        if k == 0:
            return min(1.0, self._own_factor(min(drafting))) if drafting else 1.0
        if drafting:
            # Nearest; between two as near, the shorter (deterministic).
            return self._own_factor(min(drafting, key=lambda j: (abs(j - k), j)))
        if self.learned(0):
            return self._own_factor(0)
        return 1.0

    def step_time(self, num_reqs: int, k: int) -> float:
        """The corrected time of a step verifying ``k`` drafts, never less than a shorter
        length's: a step that verifies more drafts runs the same forward pass over more
        tokens and drafts more, so it cannot be cheaper. Each length's factor is learned at
        its own moments and batch sizes, and a rarely visited length's factor can come out
        low: on the H100 (session 30, suffix with every draft rejected) the one-token
        factor swung between 0.72 and 1.27 as its probes' intervals, attributed through the
        async pipeline, fell in two groups (4.7 and 8.6 ms at batch 1, where a plain step
        took 6). At 0.72 a one-token draft looked 20% cheaper than a plain step, so drafting
        with nothing accepted looked like a gain and turned on and off 20 times in one run."""
        if k < 0:
            raise ValueError(f"draft length {k} is negative")
        times = self._corrected.get(num_reqs)
        if times is None:
            if len(self._corrected) >= 64:  # batch sizes between two observations: bounded
                self._corrected.clear()
            times = self._corrected[num_reqs] = []
        while len(times) <= k:  # extend the running maximum to length k
            j = len(times)
            seconds = self.table.step_time(num_reqs, j) * self.factor(j)
            times.append(max(times[-1], seconds) if times else seconds)
        return times[k]

    def changes(self, lengths, threshold: float = 0.25) -> list[tuple[int, float, float]]:
        """(k, factor last reported, factor now) for each of ``lengths`` whose own learned
        factor moved by more than ``threshold`` (relative) since it was last reported; those
        become the reported factors. Borrowed factors are not reported: they follow a length
        that is."""
        moved = []
        for k in lengths:
            if not self.learned(k):
                continue
            now = self._own_factor(k)
            before = self._reported.get(k, 1.0)
            if abs(now - before) > threshold * before:
                self._reported[k] = now
                moved.append((k, before, now))
        return moved
