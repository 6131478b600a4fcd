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

Fading is also how a longer draft is tried again. A position that the chosen drafts no longer
reach keeps fading, so its estimate drifts back towards the pooled rate until a longer draft
looks worth it, is verified, and misses. At synthetic acceptance 3.0 (positions 1-2 always
accepted, 3-4 never) that put EAGLE-3 at 3 or 4 drafts in 21% of its batch-1 steps on the
H200 (session 62), two drafter passes more each. ``untested_decay`` (opt-in,
``SPECDEC_ADAPTIVE_UNTESTED_DECAY``) fades the counts of a position that a step's
observation did not test at its own, slower rate: 0.99 makes those steps about 4 in 100 in
a CPU simulation of that workload (``tests/test_adaptive_untested_decay.py``), at the price
of a slower return to deeper drafts when they start to land. Opt-in until measured on a GPU
with real prompts.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specdec_plugin.adaptive.request_rows import ACCEPTED, TESTED, RequestRows


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
    # The multiplier of a position's counts at a step whose observation did not test it
    # (None: ``decay``, as for a tested one). See the module's docstring.
    untested_decay: float | None = None

    def fading(self, tested: np.ndarray) -> float | np.ndarray:
        """The multiplier of the old counts where ``tested`` (> 0) says which positions the new
        observation tested: ``decay`` everywhere unless ``untested_decay`` is set."""
        if self.untested_decay is None:
            return self.decay
        return np.where(tested > 0, self.decay, self.untested_decay)


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
        # This step's engine-wide counts so far: tested, accepted.
        self._step_counts = np.zeros((2, k))
        self._rows = RequestRows(k)
        # The new counts of a draft of d tokens with m accepted, [2, K], at d * (K + 1) + m:
        # looked up for a whole step at once rather than built per observation. Positions
        # 1..m accepted, m+1 rejected if drafted: tested are the first min(d, m + 1).
        drafted, accepted = np.divmod(np.arange((k + 1) ** 2), k + 1)
        limits = np.empty(((k + 1) ** 2, 2), dtype=np.int64)
        limits[:, TESTED] = np.minimum(drafted, accepted + 1)
        limits[:, ACCEPTED] = accepted
        self._new_counts = (np.arange(k) < limits[:, :, None]).astype(float)
        # (req_id, drafted, accepted) reported since the last fold.
        self._pending: list[tuple[str, int, int]] = []
        # engine_rates() of the current engine counts; None once they change.
        self._engine_rates: np.ndarray | None = None
        # Bumped whenever anything batch_rates() or count_unseen() read may have changed (a fold
        # of new results, the engine counts, a request's row released), so that a caller can
        # keep what it derived from them while this stays the same (the controller's decision
        # on steps that draft nothing, controller.py).
        self.version = 0

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
        self.version += 1
        req_ids, drafted, accepted = zip(*pending)
        drafted = np.minimum(np.array(drafted, dtype=np.int64), self.settings.max_k)
        accepted = np.minimum(np.maximum(np.array(accepted, dtype=np.int64), 0), drafted)
        keep = drafted > 0
        if not keep.all():  # only with max_k = 0
            req_ids = [r for r, kept in zip(req_ids, keep) if kept]
            drafted, accepted = drafted[keep], accepted[keep]
            if not req_ids:
                return
        new = self._new_counts[drafted * (self.settings.max_k + 1) + accepted]
        # Sums of zeros and ones: exact in any order, so equal to adding them one by one.
        self._step_counts += new.sum(axis=0)
        get = self._rows.index.get
        rows = [get(req_id) for req_id in req_ids]
        if None in rows:  # new requests: rows for them (once for one reported twice)
            rows = [self._rows.row(req_id) for req_id in req_ids]
        if len(set(rows)) == len(rows):
            self._fold_rows(rows, new)
            return
        # A request reported twice before a fold decays twice, as it did folded one by one:
        # fold in runs in which no request repeats.
        start, seen = 0, set()
        for i, r in enumerate(rows):
            if r in seen:
                self._fold_rows(rows[start:i], new[start:i])
                start, seen = i, set()
            seen.add(r)
        self._fold_rows(rows[start:], new[start:])

    def _fold_rows(self, rows, new: np.ndarray) -> None:
        counts = self._rows.counts
        # [rows, K] -> [rows, 1, K]: tested and accepted counts of a position fade together.
        fading = self.settings.fading(new[:, TESTED])
        if not np.isscalar(fading):
            fading = fading[:, None, :]
        counts[rows] = counts[rows] * fading + new

    def end_step(self) -> None:
        """Fold this step's observations into the engine-wide counts."""
        self._fold()
        step = self._step_counts
        if step[TESTED].any():
            fading = self.settings.fading(step[TESTED])
            self.tested = self.tested * fading + step[TESTED]
            self.accepted = self.accepted * fading + step[ACCEPTED]
            self._step_counts = np.zeros_like(step)
            self._engine_rates = None
            self.version += 1

    def count_unseen(self, req_ids) -> int:
        """How many of ``req_ids`` have no verification result of their own yet."""
        self._fold()
        index = self._rows.index
        return sum(req_id not in index for req_id in req_ids)

    def forget(self, req_id: str) -> None:
        self._fold()  # its pending results still count for the engine, as they did
        self._rows.release(req_id)
        self.version += 1

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
        get = self._rows.index.get
        rows = [get(req_id, -1) for req_id in req_ids]
        if not rows:
            return engine[None, :].copy()
        w = self.settings.request_prior_weight
        counts = self._rows.counts
        if -1 not in rows:  # the usual step: every request has history
            own = counts[rows]
            return (own[:, ACCEPTED] + engine * w) / (own[:, TESTED] + w)
        out = np.empty((len(rows), len(engine)))
        out[:] = engine
        known = np.array(rows)
        where = np.flatnonzero(known >= 0)
        if len(where):
            own = counts[known[where]]
            out[where] = (own[:, ACCEPTED] + engine * w) / (own[:, TESTED] + w)
        return out
