"""How long one engine step takes, by batch size and draft length.

Measured, not guessed: ``measure.py`` times the target's forward pass and the drafter's
forward pass at a spread of token counts on the device at engine start, and this module
interpolates between those points (linearly; past the last point, along the last slope).

A step that verifies k drafts for each of n requests and drafts k more costs, in steady state:

    target(n*(1+k))                          verification (forward pass, LM head, argmax)
  + drafter(n*(1+k)) + (k-1) * drafter(n)    drafting: one pass over the verified tokens,
                                             then one pass per further draft token
  + k * drafter_sample(n)                    the drafter's LM head and argmax per draft token
  + SPEC_STEP_OVERHEAD * target(n)           sampling and bookkeeping of speculation
For k = 0 only the target runs, plus the drafter's pass over the new tokens when the drafter
keeps its KV cache in sync at k = 0 (vLLM's EAGLE-family and draft-model proposers do, so that
their drafts stay good when drafting resumes); n-gram and suffix drafting cost no device time.
Where those passes are deferred (spec_decode/deferred_sync.py: EAGLE, EAGLE-3, MTP, draft
model), one pass
over ``drafter_sync_every`` tokens per request replaces that many steps' passes, so a k = 0
step pays ``drafter(n * d) / d``. The flush a drafting step pays after a run of k = 0 steps
is left out: a cost of changing regime, not of either regime's steady state.

On graph devices a drafting step replays one padded graph of vLLM's whole ``propose`` for its
length (spec_decode/drafter_graphs.py), so where that graph was timed at start-up
(``draft_graph_s``, SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST) it replaces the three drafting terms
above: a pass timed on its own through ``dummy_run`` pays its launches and a synchronisation
that the passes inside one graph do not, and the sum of k of them overstated what a longer
draft adds (session 42, H200: 0.34 ms a pass where a draft token left out saved about 0.18).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

# What a speculative step costs beyond the timed forward passes (rejection sampling, the
# drafter's sampling and input preparation, bookkeeping), as a fraction of a plain step. An
# estimate, not measured at start-up: a draft must promise at least this much before the
# controller pays for it.
SPEC_STEP_OVERHEAD = 0.05

# At most this many step_time results kept (batch sizes up to a few thousand times the lengths).
STEP_TIMES_CACHED = 16384


@dataclass(frozen=True)
class CostTable:
    token_counts: tuple[int, ...]
    target_s: tuple[float, ...]
    # None: the proposer has no device model (n-gram, suffix).
    drafter_s: tuple[float, ...] | None = None
    # The drafter runs its pass over the new tokens even when no draft is asked for.
    drafter_syncs_at_zero: bool = False
    # Steps whose drafter passes one deferred pass covers (1: a pass every step).
    drafter_sync_every: int = 1
    # The drafter's LM head and greedy pick over this many rows, paid once per draft token;
    # None: not measured (tables written before it was, proposers without a model). The draft
    # model's own 49152-token head made most of a draft token's cost on the CPU (issue 11).
    drafter_sample_s: tuple[float, ...] | None = None
    source: str = "measured"
    # The whole drafting of a step of k drafts, as the padded drafter graph of that length
    # replays it: draft_graph_s[k - 1][i] seconds at draft_graph_reqs[i] requests (the graphs'
    # padded sizes). None: not timed (devices without graphs, proposers without a model, the
    # switch off).
    draft_graph_reqs: tuple[int, ...] | None = None
    draft_graph_s: tuple[tuple[float, ...], ...] | None = None

    def __post_init__(self):
        if len(self.token_counts) < 1 or len(self.token_counts) != len(self.target_s):
            raise ValueError("CostTable needs one target time per token count")
        if list(self.token_counts) != sorted(set(self.token_counts)):
            raise ValueError("CostTable token counts must be increasing")
        if self.drafter_s is not None and len(self.drafter_s) != len(self.token_counts):
            raise ValueError("CostTable needs one drafter time per token count")
        if (self.drafter_sample_s is not None
                and len(self.drafter_sample_s) != len(self.token_counts)):
            raise ValueError("CostTable needs one drafter sampling time per token count")
        if self.draft_graph_s is not None:
            reqs = self.draft_graph_reqs or ()
            if not reqs or list(reqs) != sorted(set(reqs)):
                raise ValueError("CostTable drafter-graph request counts must be increasing")
            if any(len(row) != len(reqs) for row in self.draft_graph_s):
                raise ValueError("CostTable needs one drafter-graph time per request count")
        # step_time's results: the controller asks for the same few (batch size, length) pairs
        # every engine step, and each answer costs several interpolations. Not a field: not
        # compared, hashed or written by to_json.
        object.__setattr__(self, "_step_times", {})

    @staticmethod
    def _interp(xs, ys, x: float) -> float:
        xs = np.asarray(xs, dtype=float)
        ys = np.asarray(ys, dtype=float)
        if len(xs) == 1:
            return float(ys[0] * max(x, 1.0) / xs[0]) if x > xs[0] else float(ys[0])
        if x <= xs[-1]:
            return float(np.interp(x, xs, ys))
        slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
        return float(ys[-1] + slope * (x - xs[-1]))

    @classmethod
    def _at_or_above(cls, xs, ys, x: float) -> float:
        """``ys`` at the first of ``xs`` at or above ``x``: a padded graph serves every batch
        up to its size at its size's cost. Past the last, along the last slope."""
        for xi, yi in zip(xs, ys):
            if xi >= x:
                return float(yi)
        return cls._interp(xs, ys, x)

    def target(self, tokens: int) -> float:
        return self._interp(self.token_counts, self.target_s, tokens)

    def drafter(self, tokens: int) -> float:
        if self.drafter_s is None:
            return 0.0
        return self._interp(self.token_counts, self.drafter_s, tokens)

    def drafter_sample(self, rows: int) -> float:
        if self.drafter_sample_s is None:
            return 0.0
        return self._interp(self.token_counts, self.drafter_sample_s, rows)

    def step_time(self, num_reqs: int, k: int) -> float:
        key = (num_reqs, k)
        seconds = self._step_times.get(key)
        if seconds is None:
            if len(self._step_times) >= STEP_TIMES_CACHED:
                self._step_times.clear()
            seconds = self._step_times[key] = self._step_time(num_reqs, k)
        return seconds

    def _step_time(self, num_reqs: int, k: int) -> float:
        n = max(num_reqs, 1)
        if k <= 0:
            if not self.drafter_syncs_at_zero:
                return self.target(n)
            d = max(self.drafter_sync_every, 1)
            return self.target(n) + self.drafter(n * d) / d
        if self.draft_graph_s is not None and k <= len(self.draft_graph_s):
            drafting = self._at_or_above(self.draft_graph_reqs, self.draft_graph_s[k - 1], n)
            return self.target(n * (1 + k)) + drafting + SPEC_STEP_OVERHEAD * self.target(n)
        return (self.target(n * (1 + k)) + self.drafter(n * (1 + k)) + (k - 1) * self.drafter(n)
                + k * self.drafter_sample(n) + SPEC_STEP_OVERHEAD * self.target(n))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "CostTable":
        raw = json.loads(text)
        raw["token_counts"] = tuple(raw["token_counts"])
        raw["target_s"] = tuple(raw["target_s"])
        for key in ("drafter_s", "drafter_sample_s", "draft_graph_reqs"):
            if raw.get(key) is not None:
                raw[key] = tuple(raw[key])
        if raw.get("draft_graph_s") is not None:
            raw["draft_graph_s"] = tuple(tuple(row) for row in raw["draft_graph_s"])
        return cls(**raw)


def fallback_table(has_drafter_model: bool) -> CostTable:
    """Used only when start-up timing failed (logged): a memory-bound step whose cost grows
    slowly with tokens, and a drafter a tenth of the target. Relative numbers suffice, since
    the policy compares step times with each other."""
    counts = (1, 64, 512, 4096)
    target = (1.0, 1.1, 2.0, 12.0)
    drafter = tuple(0.1 * t for t in target) if has_drafter_model else None
    return CostTable(counts, target, drafter, drafter_syncs_at_zero=has_drafter_model,
                     source="fallback")
