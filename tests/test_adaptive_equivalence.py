"""The controller's host-side speed-ups change no decision (specdec_plugin/adaptive/).

The acceptance tracker buffers each step's observations and folds them together into rows of
one array; the policy and the cost table avoid recomputing what a step's scores share. Each of
those is meant to compute what the earlier code computed. Here the earlier code, copied below
as it was (``RefTracker``, ``ref_choose``, ``RefCost``), and the current code are driven with the
same random streams: requests arriving and leaving, drafts of 0..K (and out of range), accepted
0..drafted (and out of range), a request now and then reported twice in a step or forgotten
right after its report. Rates must agree to 1e-12 and the chosen draft length at every step.

A fresh seed each run, printed (and in every failure message); SPECDEC_TEST_SEED=<n> replays one.
"""
from __future__ import annotations

import os
import random
from unittest import mock

import numpy as np
import pytest

import specdec_plugin.adaptive.controller as controller_module
from specdec_plugin.adaptive.acceptance import AcceptanceSettings
from specdec_plugin.adaptive.controller import DraftLengthController
from specdec_plugin.adaptive.cost_model import SPEC_STEP_OVERHEAD, CostTable
from specdec_plugin.adaptive.observed_cost import ObservedCost
from specdec_plugin.adaptive.policy import Decision, choose_draft_length


# --- The earlier code, as it was (acceptance.py, policy.py, cost_model.py step_time) ---------

def _ref_rates(tested, accepted, prior, prior_weight, pool_weight):
    pooled = (accepted.sum() + prior * prior_weight) / (tested.sum() + prior_weight)
    base = (pooled * pool_weight + prior * prior_weight) / (pool_weight + prior_weight)
    return (accepted + base * (pool_weight + prior_weight)) / (tested + pool_weight + prior_weight)


class RefTracker:
    def __init__(self, settings):
        self.settings = settings
        k = settings.max_k
        self.tested = np.zeros(k)
        self.accepted = np.zeros(k)
        self._step_tested = np.zeros(k)
        self._step_accepted = np.zeros(k)
        self._requests = {}

    def observe(self, req_id, num_drafted, num_accepted):
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

    def end_step(self):
        if self._step_tested.any():
            decay = self.settings.decay
            self.tested = self.tested * decay + self._step_tested
            self.accepted = self.accepted * decay + self._step_accepted
            self._step_tested = np.zeros_like(self._step_tested)
            self._step_accepted = np.zeros_like(self._step_accepted)

    def forget(self, req_id):
        self._requests.pop(req_id, None)

    def count_unseen(self, req_ids):
        # Not part of the earlier code: added with the probes for new requests (controller.py).
        return sum(req_id not in self._requests for req_id in req_ids)

    def engine_rates(self):
        s = self.settings
        return _ref_rates(self.tested, self.accepted, s.prior_rate, s.prior_weight, s.pool_weight)

    def batch_rates(self, req_ids):
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


def _ref_expected_tokens(rates, k):
    rates = np.atleast_2d(rates)
    if k <= 0:
        return np.ones(rates.shape[0])
    reach = np.cumprod(rates[:, :k], axis=1)
    return 1.0 + reach.sum(axis=1)


def ref_choose(rates, cost, allowed, min_gain=0.03, drafting=True, resume_gain=0.10,
               protect_quantile=None, current=None, switch_gain=None, length_gain=None):
    # The controllers compared here leave protection, the length hold and the length margin off.
    assert protect_quantile is None and switch_gain is None and length_gain is None
    rates = np.clip(np.atleast_2d(np.asarray(rates, dtype=float)), 0.0, 1.0)
    n = rates.shape[0]
    max_k = rates.shape[1]
    scores = {}
    for k in sorted(set(allowed)):
        if k < 0 or k > max_k:
            raise ValueError(f"draft length {k} outside 0..{max_k}")
        seconds = cost.step_time(n, k)
        if seconds <= 0:
            raise ValueError(f"step time for n={n}, k={k} must be positive, got {seconds}")
        scores[k] = float(_ref_expected_tokens(rates, k).sum() / seconds)
    best = min(scores)
    for k in sorted(scores):
        if scores[k] > scores[best] * (1.0 + min_gain):
            best = k
    # Not part of the earlier code: the hysteresis added later (policy.py), the same rule, so
    # that the controllers compared here still decide alike.
    if not drafting and best > 0 and 0 in scores and scores[best] <= scores[0] * (1.0 + resume_gain):
        best = 0
    return Decision(best, scores)


class RefCost:
    """CostTable.step_time as it was: interpolation from the table's tuples at every call."""

    def __init__(self, table: CostTable):
        self.t = table

    @staticmethod
    def _interp(xs, ys, x):
        xs = np.asarray(xs, dtype=float)
        ys = np.asarray(ys, dtype=float)
        if len(xs) == 1:
            return float(ys[0] * max(x, 1.0) / xs[0]) if x > xs[0] else float(ys[0])
        if x <= xs[-1]:
            return float(np.interp(x, xs, ys))
        slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
        return float(ys[-1] + slope * (x - xs[-1]))

    def target(self, tokens):
        return self._interp(self.t.token_counts, self.t.target_s, tokens)

    def drafter(self, tokens):
        if self.t.drafter_s is None:
            return 0.0
        return self._interp(self.t.token_counts, self.t.drafter_s, tokens)

    def drafter_sample(self, rows):
        if self.t.drafter_sample_s is None:
            return 0.0
        return self._interp(self.t.token_counts, self.t.drafter_sample_s, rows)

    def step_time(self, num_reqs, k):
        n = max(num_reqs, 1)
        if k <= 0:
            if not self.t.drafter_syncs_at_zero:
                return self.target(n)
            d = max(self.t.drafter_sync_every, 1)
            return self.target(n) + self.drafter(n * d) / d
        return (self.target(n * (1 + k)) + self.drafter(n * (1 + k)) + (k - 1) * self.drafter(n)
                + k * self.drafter_sample(n) + SPEC_STEP_OVERHEAD * self.target(n))


# --- The comparison ---------------------------------------------------------------------------

@pytest.fixture
def seed():
    value = int(os.environ.get("SPECDEC_TEST_SEED") or random.SystemRandom().randrange(2**32))
    print(f"seed {value} (SPECDEC_TEST_SEED={value} replays it)")
    return value


def _tables(rng: random.Random):
    counts = (1, 2, 4, 8, 16, 32, 64, 128, 256, 320)
    flat = CostTable(counts, tuple(0.006 + 0.00001 * c for c in counts))
    gpu_like = CostTable((1, 64, 256, 1024), (6.0e-3, 6.3e-3, 9.0e-3, 30.0e-3),
                         (0.4e-3, 0.45e-3, 0.8e-3, 2.5e-3), drafter_syncs_at_zero=True,
                         drafter_sync_every=rng.choice((1, 4)),
                         drafter_sample_s=(1e-4, 1.2e-4, 2e-4, 5e-4))
    one_point = CostTable((8,), (0.01,), (0.002,))
    return [flat, gpu_like, one_point]


def _controllers(rng, max_k, table, allowed, learn_costs):
    settings = AcceptanceSettings(max_k=max_k, decay=rng.choice((0.95, 0.8, 1.0)),
                                  request_prior_weight=rng.choice((4.0, 1.0, 0.3)))
    new = DraftLengthController(max_k, table, allowed, settings, learn_costs=learn_costs)
    ref = DraftLengthController(max_k, table, allowed, settings, learn_costs=learn_costs)
    ref.tracker = RefTracker(settings)
    if learn_costs:
        ref.observed_cost = ref.cost = ObservedCost(RefCost(table))
    else:
        ref.cost = RefCost(table)
    return new, ref


@pytest.mark.parametrize("case", range(6))
def test_tracker_and_controller_match_the_earlier_code(seed, case):
    rng = random.Random(seed * 10 + case)
    max_k = rng.randint(1, 7)
    table = rng.choice(_tables(rng))
    allowed = None if case % 2 == 0 else sorted({0, *rng.sample(range(1, max_k + 1),
                                                                 rng.randint(1, max_k))})
    new, ref = _controllers(rng, max_k, table, allowed, learn_costs=case >= 3)
    # How good drafts are drifts, so that the decisions move between lengths and off.
    quality = rng.random()
    active: list[str] = []
    gone: list[str] = []
    next_id = 0
    k = max_k
    steps = rng.randint(300, 600)
    for step in range(steps):
        where = f"seed {seed}, case {case}, step {step}"
        quality = min(max(quality + rng.gauss(0, 0.08), 0.0), 1.0)
        # Arrivals (now and then an id that left before, whose row is reused) and departures.
        for _ in range(rng.choice((0, 0, 0, 1, 2, 8))):
            if gone and rng.random() < 0.2:
                active.append(gone.pop(rng.randrange(len(gone))))
            else:
                active.append(f"req-{next_id}")
                next_id += 1
        rng.shuffle(active)
        if len(active) > 300:
            del active[rng.randint(150, 300):]
        for _ in range(rng.choice((0, 0, 1, 3))):
            if active:
                req = active.pop(rng.randrange(len(active)))
                new.forget(req)
                ref.forget(req)
                gone.append(req)
        for req in list(active):
            drafted = k if rng.random() < 0.8 else rng.randint(-1, max_k + 2)
            accepted = sum(1 for _ in range(max(drafted, 0)) if rng.random() < quality)
            if rng.random() < 0.05:
                accepted = rng.randint(-1, max_k + 3)
            new.observe(req, drafted, accepted)
            ref.observe(req, drafted, accepted)
            if rng.random() < 0.01:  # reported twice in one step: decays twice
                new.observe(req, drafted, accepted)
                ref.observe(req, drafted, accepted)
            if rng.random() < 0.01:  # left right after its report: the engine keeps it
                new.forget(req)
                ref.forget(req)
                active.remove(req)
                gone.append(req)
        if rng.random() < 0.05:  # a read between observing and ending the step
            probe = active[:5] + ["never-seen"]
            np.testing.assert_allclose(new.tracker.batch_rates(probe),
                                       ref.tracker.batch_rates(probe), rtol=1e-12, err_msg=where)
        with mock.patch.object(controller_module, "choose_draft_length", ref_choose):
            k_ref = ref.choose(active)
        k = new.choose(active)
        assert k == k_ref, where
        ids = active + ["never-seen"]
        np.testing.assert_allclose(new.tracker.batch_rates(ids), ref.tracker.batch_rates(ids),
                                   rtol=1e-12, err_msg=where)
        np.testing.assert_allclose(new.tracker.engine_rates(), ref.tracker.engine_rates(),
                                   rtol=1e-12, err_msg=where)
        if new.observed_cost is not None:
            seconds = table.step_time(len(active), k) * rng.uniform(0.5, 3.0)
            new.observe_step_time(len(active), k, seconds)
            ref.observe_step_time(len(active), k, seconds)
    assert new.choices == ref.choices and new.probes == ref.probes, f"seed {seed}, case {case}"


@pytest.mark.parametrize("n", [1, 3, 64, 300])
def test_policy_scores_match_the_earlier_code(seed, n):
    rng = np.random.default_rng(seed + n)
    table = _tables(random.Random(seed))[1]
    for _ in range(50):
        max_k = int(rng.integers(1, 9))
        rates = rng.uniform(-0.1, 1.1, size=(n, max_k))
        allowed = range(max_k + 1)
        new = choose_draft_length(rates, table, allowed)
        ref = ref_choose(rates, RefCost(table), allowed)
        assert new.k == ref.k, f"seed {seed}"
        assert new.tokens_per_s.keys() == ref.tokens_per_s.keys()
        np.testing.assert_allclose(list(new.tokens_per_s.values()),
                                   list(ref.tokens_per_s.values()), rtol=1e-12,
                                   err_msg=f"seed {seed}")
