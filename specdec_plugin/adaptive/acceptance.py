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
    def __init__(self, settings: AcceptanceSettings):
        self.settings = settings
        k = settings.max_k
        self.tested = np.zeros(k)
        self.accepted = np.zeros(k)
        self._step_tested = np.zeros(k)
        self._step_accepted = np.zeros(k)
        self._requests: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def observe(self, req_id: str, num_drafted: int, num_accepted: int) -> None:
        """One request's verification result in this step."""
        k = self.settings.max_k
        num_drafted = min(num_drafted, k)
        num_accepted = max(0, min(num_accepted, num_drafted))
        if num_drafted <= 0:
            return
        tested = np.zeros(k)
        accepted = np.zeros(k)
        accepted[:num_accepted] = 1.0
        tested[:min(num_drafted, num_accepted + 1)] = 1.0
        self._step_tested += tested
        self._step_accepted += accepted
        own = self._requests.get(req_id)
        if own is None:
            self._requests[req_id] = (tested, accepted)
        else:
            decay = self.settings.decay
            own[0][:] = own[0] * decay + tested
            own[1][:] = own[1] * decay + accepted

    def end_step(self) -> None:
        """Fold this step's observations into the engine-wide counts."""
        if self._step_tested.any():
            decay = self.settings.decay
            self.tested = self.tested * decay + self._step_tested
            self.accepted = self.accepted * decay + self._step_accepted
            self._step_tested = np.zeros_like(self._step_tested)
            self._step_accepted = np.zeros_like(self._step_accepted)

    def forget(self, req_id: str) -> None:
        self._requests.pop(req_id, None)

    def engine_rates(self) -> np.ndarray:
        s = self.settings
        return _rates(self.tested, self.accepted, s.prior_rate, s.prior_weight, s.pool_weight)

    def batch_rates(self, req_ids) -> np.ndarray:
        """Per-request rates [n, K] for the requests of a step; requests without history get
        the engine-wide rates."""
        engine = self.engine_rates()
        s = self.settings
        rows = []
        for req_id in req_ids:
            own = self._requests.get(req_id)
            if own is None:
                rows.append(engine)
            else:
                rows.append((own[1] + engine * s.request_prior_weight)
                            / (own[0] + s.request_prior_weight))
        if not rows:
            return engine[None, :]
        return np.stack(rows)
