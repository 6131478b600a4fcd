"""The start-up cost table corrected by the step times the engine actually sees.

Why: ``measure.py`` times forward passes only. A real speculative step also pays for the
drafter's LM head and sampling, its input preparation, the rejection sampler, and their
Python. On the GPU most of that sits inside graphs, but on the CPU it is milliseconds per
step. Measured on the 2-core CPU (2026-11-25, SmolLM2, EAGLE-3, chat prompts, batch 8): the
table said drafting one token per step paid (+17% tokens/s over plain steps), and the engine
ran at 0.67x of no speculation. So the controller also times every decode step (the wall time
from one step's result to the next, measured by the scheduler), compares it with the table's
prediction for that step, and keeps a decayed mean of actual / predicted for each draft length.
The policy then scales the table's step time by that factor.

Factors are kept per batch-size bucket (powers of two) and draft length: what the table
misses grows with the batch differently for plain and drafting steps. Only steady steps are
used: every request decoding (no prefill chunk) and the step verifying as many drafts as it
asks for, which is the step the table describes. A length not yet timed at a bucket borrows
the mean factor of the drafting lengths that were (a probe times length 1), else 1. Factors
are clipped to ``[MIN_FACTOR, MAX_FACTOR]`` and each sample to the same range, so one stalled
step (a page fault, another process) moves nothing much.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# A sample's weight in the decayed mean: about the last 10 steady steps of a length.
DECAY = 0.9
# Samples of a length before its own factor is used instead of the pooled one.
MIN_SAMPLES = 3
MIN_FACTOR, MAX_FACTOR = 0.5, 4.0


def _clip(x: float) -> float:
    return min(max(x, MIN_FACTOR), MAX_FACTOR)


def batch_bucket(num_reqs: int) -> int:
    """The power of two at or above ``num_reqs``."""
    return 1 << max(num_reqs - 1, 0).bit_length()


@dataclass
class StepCostCalibration:
    """actual / predicted step time per (batch bucket, draft length), from the engine's steps."""

    factors: dict[tuple[int, int], float] = field(default_factory=dict)
    samples: dict[tuple[int, int], int] = field(default_factory=dict)

    def record(self, num_reqs: int, k: int, actual_s: float, predicted_s: float) -> None:
        if actual_s <= 0 or predicted_s <= 0:
            return
        key = (batch_bucket(num_reqs), k)
        ratio = _clip(actual_s / predicted_s)
        if key in self.factors:
            self.factors[key] = DECAY * self.factors[key] + (1 - DECAY) * ratio
        else:
            self.factors[key] = ratio
        self.samples[key] = self.samples.get(key, 0) + 1

    def factor(self, num_reqs: int, k: int) -> float:
        bucket = batch_bucket(num_reqs)
        if self.samples.get((bucket, k), 0) >= MIN_SAMPLES:
            return _clip(self.factors[(bucket, k)])
        if k > 0:
            drafting = [f for (b, j), f in self.factors.items() if b == bucket and j > 0]
            if drafting:
                return _clip(sum(drafting) / len(drafting))
        return 1.0


class CalibratedCost:
    """A cost table (``policy.StepCost``) with each step's time scaled by its factor."""

    def __init__(self, table, calibration: StepCostCalibration):
        self.table = table
        self.calibration = calibration

    def step_time(self, num_reqs: int, k: int) -> float:
        return self.table.step_time(num_reqs, k) * self.calibration.factor(num_reqs, k)


def steady_decode_step(num_scheduled_tokens: dict[str, int],
                       spec_tokens: dict[str, list[int]], k_next: int) -> tuple[int, int] | None:
    """``(num_reqs, k)`` of a step the cost table describes, from vLLM's ``SchedulerOutput``
    fields, or None: a prefill chunk in the batch, or verifying a length other than the one
    it drafts."""
    if not num_scheduled_tokens:
        return None
    k_verified = 0
    for req_id, tokens in num_scheduled_tokens.items():
        drafts = len(spec_tokens.get(req_id, ()))
        if tokens != 1 + drafts:
            return None  # prefill, or a chunk of one
        k_verified = max(k_verified, drafts)
    if k_verified != k_next:
        return None
    return len(num_scheduled_tokens), k_next
