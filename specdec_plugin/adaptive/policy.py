"""The draft-length decision: a pure function, so CI can check it without a device.

For each allowed draft length k, expected tokens per step for a request with per-position
acceptance rates a_1..a_K is

    E_r(k) = 1 + sum_{j=1..k} prod_{i<=j} a_i

(the one token every step yields, plus each draft position that is reached and accepted), and
the step takes ``cost.step_time(n, k)``. We pick the k with the most tokens per second over the
batch. Ties, and gains under ``min_gain``, go to the shorter draft: a longer draft that is not
clearly better only costs memory traffic and risk.

Hysteresis. While the controller is off (its last regime was plain steps), drafting must
promise ``resume_gain`` more tokens per second than a plain step before it starts again; while
on, it keeps drafting as long as it promises ``min_gain``. Why: the prediction is biased towards
drafting. The cost table times forward passes only, and what else a speculative step costs
(rejection sampling, the proposer's launches, the scheduler's per-request work on drafts) grows
with the batch. On the H100 (issue 11, real prompts, SmolLM2 padded to 7B), n-gram at batch
16-64 predicted gains of 4-10% for one-token drafts (session 15's logs) and ran 5-25% slower
than plain decoding, flipping on and off at every probe. A gain that small is inside the
prediction's error; one that large (code editing at batch 1-16 predicted several tens of
percent) is not.

Holding a draft length (opt-in, ``switch_gain``). While drafting at length c, another drafting
length replaces c only if it promises ``switch_gain`` more tokens per second than c. Without it,
the shorter-first scan above picks afresh every step: where two lengths score within a few
percent of each other, the choice follows the noise of the acceptance estimates. On the H200
(issue 11, session 37, SmolLM2 padded to 7B, code edits at batch 32, EAGLE-3) the start-up
table scored lengths 3 and 4 within 1%; the engine drafted 3.58 tokens per step and took 1.16x
the time of K every step. Measured on the H200 in session 40 (``ours-hold`` in
benchmarks/bench_gpu_side_by_side.py, batches 4-64), holding did no better than the default
and is not one; turning drafting off is not held (the hysteresis above governs on and off).
There, at batch 32, steps drafting 3 took as long as steps drafting 4 (7.6 ms from one step
to the next, SPECDEC_STEP_LOG), where a table of forward passes puts them 0.6 ms apart.

The margin between drafting lengths (opt-in, ``length_gain``). By default a longer drafting
length must also beat the best shorter one by ``min_gain``, so up to 3% of predicted throughput
is given up for shorter drafts. On the H200 (session 42, EAGLE-3, prose at batch 1) the steps'
own times put 4 drafts about 2.6% ahead of 3, and the engine drafted 3.15 tokens a step where K
every step was 3% faster; the table's bias there ran the other way too (it overstated what a
draft token costs, cost_model.py), so the margin protected against nothing. ``length_gain``
(``SPECDEC_ADAPTIVE_LENGTH_GAIN``; 0: the best drafting length) keeps ``min_gain`` between
plain steps and drafting only. Opt-in until measured on a GPU.

Protecting the least accepting requests (opt-in, ``protect_quantile``). Every request of a step
verifies the same k (uniform drafts), so a step whose drafts pay on average can still make the
requests whose drafts miss slower: they wait for a longer verification and gain nothing. In a
closed batch the slowest request sets the wall time. With ``protect_quantile`` q, a length k is
chosen only if the request at the q-quantile of expected tokens per step is expected to be no
slower than in a plain step: E_q(k) / step(n, k) >= 1 / step(n, 0). Why it is considered: on
the H100 at code_edit batch 64 (issue 11, session 16) n-gram drafted about 4 tokens in half
the steps with 1.03 tokens accepted per request per drafting step, near break-even for the
batch's throughput, and the batch took 1.25x as long as plain decoding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np


class StepCost(Protocol):
    def step_time(self, num_reqs: int, k: int) -> float: ...


@dataclass(frozen=True)
class Decision:
    k: int
    tokens_per_s: dict[int, float]


def expected_tokens(rates: np.ndarray, k: int) -> np.ndarray:
    """E_r(k) for each row of ``rates`` [n, K]."""
    rates = np.atleast_2d(rates)
    if k <= 0:
        return np.ones(rates.shape[0])
    reach = np.cumprod(rates[:, :k], axis=1)
    return 1.0 + reach.sum(axis=1)


# The defaults: the controller's (controller.py) unless the environment overrides resume_gain.
MIN_GAIN = 0.03
RESUME_GAIN = 0.10


@dataclass(frozen=True)
class BatchTokens:
    """What the acceptance rates say about one batch, before any step time: the expected
    tokens per step of the whole batch by draft length, and (with ``protect_quantile``) those
    of the request at that quantile. The controller keeps it while the rates and the batch
    stay the same, which is every step while nothing is drafted: then only step times, which
    observed step costs change every step, need reading again (controller.py)."""
    n: int
    max_k: int
    tokens: dict[int, float]
    protected: dict[int, float] | None = None


def batch_tokens(rates: np.ndarray, allowed: Sequence[int],
                 protect_quantile: float | None = None) -> BatchTokens:
    """rates: [n, K] acceptance per request and position; allowed: the lengths to score."""
    rates = np.clip(np.atleast_2d(np.asarray(rates, dtype=float)), 0.0, 1.0)
    n = rates.shape[0]
    max_k = rates.shape[1]
    lengths = sorted(set(allowed))
    # expected_tokens for every length from one cumulative product, not one per length: the
    # controller calls this every engine step. A running product's prefix is the product of the
    # prefix, so each length's E_r(k) is what expected_tokens(rates, k) computes
    # (tests/test_adaptive_equivalence.py compares with the per-length code).
    reach = np.cumprod(rates[:, :lengths[-1]], axis=1) if lengths and lengths[-1] > 0 else None
    protect = protect_quantile is not None and 0 in lengths
    rank = int(protect_quantile * (n - 1)) if protect else 0
    tokens: dict[int, float] = {}
    protected: dict[int, float] | None = {} if protect else None
    for k in lengths:
        if k < 0 or k > max_k:
            raise ValueError(f"draft length {k} outside 0..{max_k}")
        if k == 0:
            tokens[k] = float(n)
        else:  # (1 + reach.sum(axis=1)).sum(), by the ufunc that ndarray.sum calls: less wrapping
            per_request = 1.0 + np.add.reduce(reach[:, :k], axis=1)
            tokens[k] = np.add.reduce(per_request)
            if protected is not None:
                protected[k] = np.partition(per_request, rank)[rank]
    return BatchTokens(n, max_k, tokens, protected)


def decide(batch: BatchTokens, cost: StepCost, min_gain: float = MIN_GAIN,
           drafting: bool = True, resume_gain: float = RESUME_GAIN,
           current: int | None = None, switch_gain: float | None = None,
           length_gain: float | None = None) -> Decision:
    """The draft length for ``batch`` at ``cost``'s step times (the arguments as in
    ``choose_draft_length``)."""
    n = batch.n
    scores: dict[int, float] = {}
    # Lengths that would slow the protected request down: scored (for the log), never chosen.
    barred: set[int] = set()
    plain_seconds = cost.step_time(n, 0) if batch.protected is not None else None
    for k, tokens in batch.tokens.items():
        seconds = cost.step_time(n, k)
        if seconds <= 0:
            raise ValueError(f"step time for n={n}, k={k} must be positive, got {seconds}")
        if k > 0 and plain_seconds is not None and batch.protected[k] * plain_seconds < seconds:
            barred.add(k)
        scores[k] = float(tokens / seconds)
    best = min(scores)
    for k in sorted(scores):
        # Over a plain step min_gain; over a shorter drafting length, length_gain where given.
        margin = min_gain if best == 0 or length_gain is None else length_gain
        if k not in barred and scores[k] > scores[best] * (1.0 + margin):
            best = k
    resuming = not drafting and best > 0 and 0 in scores
    if resuming and scores[best] <= scores[0] * (1.0 + resume_gain):
        best = 0
    held = (switch_gain is not None and current and best > 0 and best != current
            and current in scores and current not in barred)
    if held and scores[best] <= scores[current] * (1.0 + switch_gain):
        best = current
    return Decision(best, scores)


def choose_draft_length(rates: np.ndarray, cost: StepCost, allowed: Sequence[int],
                        min_gain: float = MIN_GAIN, drafting: bool = True,
                        resume_gain: float = RESUME_GAIN,
                        protect_quantile: float | None = None, current: int | None = None,
                        switch_gain: float | None = None,
                        length_gain: float | None = None) -> Decision:
    """rates: [n, K] acceptance per request and position; allowed: the lengths to consider
    (0 means a plain decode step); drafting: whether the controller's current regime drafts
    (False: it has been taking plain steps, and drafting must gain ``resume_gain`` to start);
    protect_quantile: None, or the quantile of requests (by expected tokens per step) that a
    drafting length may not slow down; current: the length drafted last step; switch_gain:
    None (no hold), or how much more throughput another drafting length must promise to
    replace ``current`` while drafting; length_gain: None (``min_gain``), or how much more a
    longer drafting length must promise than the best shorter drafting length."""
    return decide(batch_tokens(rates, allowed, protect_quantile), cost, min_gain=min_gain,
                  drafting=drafting, resume_gain=resume_gain, current=current,
                  switch_gain=switch_gain, length_gain=length_gain)
