"""The adaptive controller's probes while it drafts nothing: how soon the first one comes.

A probe verifies one draft token per request. At batch 1 that costs a few percent of a step;
at batch 64 on an H200 it cost 1.9 ms over a 5.1 ms plain step (BENCHMARKS.md, session 32),
so the first probe interval grows with the probe's cost (``first_probe_every``)."""
from __future__ import annotations

import pytest

from specdec_plugin.adaptive.controller import (
    FIRST_PROBE_EVERY,
    MAX_PROBE_EVERY,
    PROBE_BUDGET,
    DraftLengthController,
    first_probe_every,
)
from specdec_plugin.adaptive.cost_model import CostTable

K = 4
# Target forward times by token count: flat up to 64 tokens, then steep, as a 7B at batch 64
# (a probe at batch 64 verifies 128 tokens).
STEEP = CostTable((1, 64, 128, 320), (6.0e-3, 6.2e-3, 8.4e-3, 14.0e-3))


def test_first_probe_every_keeps_probing_within_its_budget():
    # A probe 37% dearer than a plain step, half a percent of the time: 74 plain steps first.
    assert first_probe_every(1.37, 1.0, 0.005) == 74
    assert first_probe_every(1.37e-3, 1.0e-3, 0.01) == 37
    # Cheap probes never come sooner than before; dear ones never later than the cap.
    assert first_probe_every(1.02, 1.0, 0.005) == FIRST_PROBE_EVERY
    assert first_probe_every(0.9, 1.0, 0.005) == FIRST_PROBE_EVERY
    assert first_probe_every(10.0, 1.0, 0.005) == MAX_PROBE_EVERY
    # Budget 0: the fixed first interval.
    assert first_probe_every(1.37, 1.0, 0.0) == FIRST_PROBE_EVERY


def _probe_steps(controller, req_ids, steps):
    """Drive ``steps`` steps of the batch ``req_ids``, every draft rejected; the indices of the
    steps that drafted."""
    drafted = []
    for i in range(steps):
        k = controller.choose(req_ids)
        if k:
            drafted.append(i)
            for req in req_ids:
                controller.observe(req, k, 0)
    return drafted


def _expected_first(controller, n):
    return first_probe_every(controller.cost.step_time(n, 1), controller.cost.step_time(n, 0),
                             controller.probe_budget)


@pytest.mark.parametrize("budget", [PROBE_BUDGET, 0.02, 0.0])
def test_the_first_probe_at_batch_64_waits_for_its_cost(budget):
    batch = [f"r{i}" for i in range(64)]
    controller = DraftLengthController(K, STEEP, learn_costs=False, probe_budget=budget)
    first = _expected_first(controller, 64)
    if budget:
        assert first > FIRST_PROBE_EVERY  # the steep table makes a probe dear at batch 64
    else:
        assert first == FIRST_PROBE_EVERY
    drafted = _probe_steps(controller, batch, 20 + first + 2 * first + 1)
    # Optimistic start, off after the misses; then one-token probes at the first interval,
    # then at twice it (the probe's own step is the interval's last).
    start = [i for i in drafted if i < 10]
    probes = [i for i in drafted if i >= 10]
    assert start and controller.last_k == 0
    off = start[-1] + 1
    assert probes[:2] == [off + first - 1, off + 3 * first - 1], (drafted, first)


def test_at_batch_1_the_first_probe_comes_as_before():
    controller = DraftLengthController(K, STEEP, learn_costs=False)
    assert _expected_first(controller, 1) == FIRST_PROBE_EVERY
    drafted = _probe_steps(controller, ["r"], 60)
    start = [i for i in drafted if i < 10]
    assert [i for i in drafted if i >= 10][0] == start[-1] + FIRST_PROBE_EVERY


def test_a_new_request_at_batch_64_is_probed_within_the_first_interval():
    batch = [f"r{i}" for i in range(64)]
    controller = DraftLengthController(K, STEEP, learn_costs=False)
    first = _expected_first(controller, 64)
    _probe_steps(controller, batch, 3000)
    assert controller.probe_every == MAX_PROBE_EVERY
    # One request is replaced by one with no evidence: probed within the first interval,
    # not at the backed-off one, and not sooner than the cost allows.
    joined = batch[1:] + ["new"]
    drafted = _probe_steps(controller, joined, first + 1)
    assert len(drafted) == 1 and drafted[0] <= first, (drafted, first)


# The CPU draft model's start-up table at batch 1 (issue 11, session 36, ms): a one-token probe
# costs ~38% over a plain step, so the budget alone would wait 76 plain steps for it.
CPU_DRAFT = CostTable((1, 2, 4, 8), (17.2e-3, 19.0e-3, 19.3e-3, 32.0e-3),
                      (1.95e-3, 2.69e-3, 3.01e-3, 3.86e-3), drafter_syncs_at_zero=True,
                      drafter_sync_every=8, drafter_sample_s=(1.85e-3, 1.87e-3, 1.87e-3, 3.69e-3))


def test_a_new_request_that_is_the_whole_batch_is_probed_within_the_fixed_interval():
    controller = DraftLengthController(3, CPU_DRAFT, learn_costs=False)
    budgeted = _expected_first(controller, 1)
    assert budgeted > 4 * FIRST_PROBE_EVERY  # the probe is dear: the budget holds it back
    drafted = _probe_steps(controller, ["old"], 20 + budgeted)
    start = [i for i in drafted if i < 10]
    # The request whose drafts missed waits the budgeted interval for its probe.
    assert [i for i in drafted if i >= 10][0] == start[-1] + budgeted, (drafted, budgeted)
    _probe_steps(controller, ["old"], 40)  # mid-interval when the next request arrives
    # It finishes; the next request has no evidence of its own: probed within the fixed first
    # interval, not after the earlier request's budgeted one (longer than a 64-token request).
    drafted = _probe_steps(controller, ["next"], FIRST_PROBE_EVERY)
    assert len(drafted) == 1 and drafted[0] < FIRST_PROBE_EVERY, drafted
    # That probe counts as the budgeted first one: the next waits twice the budgeted interval.
    assert controller.probe_every == 2 * budgeted
    # Its drafts missed too. The request after it, again new and the whole batch (the same
    # batch shape as before), is probed as soon, not after the doubled interval.
    drafted = _probe_steps(controller, ["third"], FIRST_PROBE_EVERY)
    assert len(drafted) == 1 and drafted[0] < FIRST_PROBE_EVERY, drafted


def test_fresh_batches_whose_drafts_miss_are_probed_as_often_as_the_budget_says():
    # Batch 64, every draft rejected, 64 new requests every 128 steps (issue 11's headline
    # benchmark): each batch is probed early, once, and not again within its run; the early
    # probe takes the budgeted one's place rather than adding to it.
    controller = DraftLengthController(K, STEEP, learn_costs=False)
    assert _expected_first(controller, 64) > FIRST_PROBE_EVERY
    per_run = []
    for run in range(6):
        batch = [f"run{run}-{i}" for i in range(64)]
        drafted = _probe_steps(controller, batch, 128)
        for req in batch:
            controller.forget(req)
        per_run.append(drafted)
    for drafted in per_run[1:]:  # the first run also drafts at start, before turning off
        assert len(drafted) == 1 and drafted[0] < FIRST_PROBE_EVERY, per_run


def _engine_like_run(controller, batch, steps, first_step=43, lag=1):
    """One run of ``batch`` as an engine serves it: only ``first_step`` requests are in the
    first step (the rest of the prefill comes in the next), and a step's verification results
    reach the controller ``lag`` steps later (async scheduling: a step is scheduled before the
    one before it is verified). Every draft rejected. The drafting steps: (index, batch size)."""
    drafted, pending = [], []
    for i in range(steps):
        for _, reqs, k in [p for p in pending if p[0] == i]:
            for req in reqs:
                controller.observe(req, k, 0)
        reqs = batch[:first_step] if i == 0 else batch
        k = controller.choose(reqs)
        if k:
            drafted.append((i, len(reqs)))
            pending.append((i + lag, reqs, k))
    for req in batch:
        controller.forget(req)
    return drafted


@pytest.mark.parametrize("lag", [1, 2])
def test_a_batch_that_arrives_over_two_steps_is_probed_once_whole(lag):
    # Batch 64 with every draft rejected, as the engine runs issue 11's headline benchmark
    # (session 44, traced on the CPU): before, each run was probed three times, once on its
    # first step's 43 requests, again 16 steps later for the other 21, and again because the
    # step after that probe still saw its requests as new (their results not yet back).
    controller = DraftLengthController(K, STEEP, learn_costs=False)
    assert 2 * _expected_first(controller, 64) > 128  # one budgeted probe per run at most
    runs = [_engine_like_run(controller, [f"run{r}-{i}" for i in range(64)], 128, lag=lag)
            for r in range(6)]
    for drafted in runs[1:]:  # the first run also drafts at start, before turning off
        assert len(drafted) == 1, runs
        step, size = drafted[0]
        assert size == 64 and step <= FIRST_PROBE_EVERY, runs
