"""Observed acceptance, per draft position, for the engine and for each request.

A draft of d tokens of which m were accepted says: positions 1..m were accepted, position
m+1 (if m < d) was rejected, positions past m+1 were never tested (verification stops at the
first rejection). So the rate we estimate is the conditional one, a_i = P(position i is
accepted | the positions before it were), from per-position counts of "tested" and "accepted".

Evidence fades: each step that brings observations first multiplies the old counts by
``decay``. A position that was rarely tested borrows from the rate pooled over all positions
(a short draft still says something about deeper ones), and a request with little history
borrows from the engine-wide rates. A step that drafts nothing changes nothing here: when to
look again is the controller's probe schedule.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specdec_plugin.adaptive.request_rows import RequestRows


@dataclass(frozen=True)
class AcceptanceSettings:
    max_k: int
    # Multiplier of the old counts at each step with new evidence: 0.95 weighs the last ~20.
    decay: float = 0.95
    # The prior rate and its weight in pseudo-tests; optimistic, so that a new engine starts
    # by drafting, as it would without the controller.
    prior_rate: float = 0.7
    prior_weight: float = 0.5
    # Pseudo-tests with which a position borrows the pooled rate, and a request the engine's.
    # Small, so that a position that keeps missing reaches a rate near zero: on the H100 with
    # 2.0 a never-accepted position 1 settled at 0.09, enough to keep one-token drafts looking
    # worth their 5% cost at batch 1.
    pool_weight: float = 1.0
    request_prior_weight: float = 4.0


def _rates(tested: np.ndarray, accepted: np.ndarray, prior: np.ndarray | float,
           prior_weight: float, pool_weight: float) -> np.ndarray:
    pooled = (accepted.sum() + prior * prior_weight) / (tested.sum() + prior_weight)
    base = (pooled * pool_weight + prior * prior_weight) / (pool_weight + prior_weight)
    return (accepted + base * (pool_weight + prior_weight)) / (tested + pool_weight + prior_weight)


class AcceptanceTracker:
    """Why observations are buffered: the scheduler reports each request's result separately
    (``observe``, once per request per step), and per-request numpy work there cost the
    controller most of its host time at large batches. ``observe`` only records; the step's
    results are folded into the counts together (``_fold``), before anything reads the
    per-request counts and at ``end_step``, with the arithmetic of folding them one by one."""

    def __init__(self, settings: AcceptanceSettings):
        self.settings = settings
        k = settings.max_k
        self.tested = np.zeros(k)
        self.accepted = np.zeros(k)
        self._step_tested = np.zeros(k)
        self._step_accepted = np.zeros(k)
        self._rows = RequestRows(k)
        self._positions = np.arange(k)
        # (req_id, drafted, accepted) reported since the last fold.
        self._pending: list[tuple[str, int, int]] = []
        # engine_rates() of the current engine counts; None once they change.
        self._engine_rates: np.ndarray | None = None

    def observe(self, req_id: str, num_drafted: int, num_accepted: int) -> None:
        """One request's verification result in this step."""
        if num_drafted > 0:  # a step that drafted nothing says nothing
            self._pending.append((req_id, num_drafted, num_accepted))

    def _fold(self) -> None:
        """Apply the pending observations, in the order they came, to each request's counts
        (``own * decay + new``) and to the step's engine-wide counts."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        k = self.settings.max_k
        drafted = np.minimum(np.array([p[1] for p in pending], dtype=np.int64), k)
        accepted = np.clip(np.array([p[2] for p in pending], dtype=np.int64), 0, drafted)
        keep = drafted > 0
        if not keep.all():  # only with max_k = 0
            pending = [p for p, kept in zip(pending, keep) if kept]
            drafted, accepted = drafted[keep], accepted[keep]
            if not pending:
                return
        # Positions 1..m accepted, m+1 rejected if drafted: tested are the first min(d, m+1).
        new_tested = (self._positions < np.minimum(drafted, accepted + 1)[:, None]).astype(float)
        new_accepted = (self._positions < accepted[:, None]).astype(float)
        # Sums of zeros and ones: exact in any order, so equal to adding them one by one.
        self._step_tested += new_tested.sum(axis=0)
        self._step_accepted += new_accepted.sum(axis=0)
        rows = [self._rows.row(p[0]) for p in pending]
        if len(set(rows)) == len(rows):
            self._fold_rows(rows, new_tested, new_accepted)
            return
        # A request reported twice before a fold decays twice, as it did folded one by one:
        # fold in runs in which no request repeats.
        start, seen = 0, set()
        for i, row in enumerate(rows):
            if row in seen:
                self._fold_rows(rows[start:i], new_tested[start:i], new_accepted[start:i])
                start, seen = i, set()
            seen.add(row)
        self._fold_rows(rows[start:], new_tested[start:], new_accepted[start:])

    def _fold_rows(self, rows, new_tested: np.ndarray, new_accepted: np.ndarray) -> None:
        decay = self.settings.decay
        tested, accepted = self._rows.tested, self._rows.accepted
        tested[rows] = tested[rows] * decay + new_tested
        accepted[rows] = accepted[rows] * decay + new_accepted

    def end_step(self) -> None:
        """Fold this step's observations into the engine-wide counts."""
        self._fold()
        if self._step_tested.any():
            decay = self.settings.decay
            self.tested = self.tested * decay + self._step_tested
            self.accepted = self.accepted * decay + self._step_accepted
            self._step_tested = np.zeros_like(self._step_tested)
            self._step_accepted = np.zeros_like(self._step_accepted)
            self._engine_rates = None

    def forget(self, req_id: str) -> None:
        self._fold()  # its pending results still count for the engine, as they did
        self._rows.release(req_id)

    def engine_rates(self) -> np.ndarray:
        # A copy, so that a caller writing into it cannot change the cache.
        return self._engine().copy()

    def _engine(self) -> np.ndarray:
        # Cached: read every step, and the engine counts change at most once per step.
        if self._engine_rates is None:
            s = self.settings
            self._engine_rates = _rates(self.tested, self.accepted, s.prior_rate,
                                        s.prior_weight, s.pool_weight)
        return self._engine_rates

    def batch_rates(self, req_ids) -> np.ndarray:
        """Per-request rates [n, K] for the requests of a step; requests without history get
        the engine-wide rates."""
        self._fold()
        engine = self._engine()
        index = self._rows.index
        rows = [index.get(req_id, -1) for req_id in req_ids]
        if not rows:
            return engine[None, :].copy()
        out = np.empty((len(rows), len(engine)))
        out[:] = engine
        known = np.array(rows)
        where = np.flatnonzero(known >= 0)
        if len(where):
            own = known[where]
            w = self.settings.request_prior_weight
            out[where] = ((self._rows.accepted[own] + engine * w)
                          / (self._rows.tested[own] + w))
        return out
