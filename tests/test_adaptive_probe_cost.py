"""What a probe costs in wall time (specdec_plugin/adaptive/probe_cost.py), how the controller's
probe budget uses it (``SPECDEC_ADAPTIVE_PROBE_COST=observed``), and the scheduler's wiring of
step intervals and probe flags to the controller, without an engine."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from specdec_plugin.adaptive.controller import (
    MAX_PROBE_EVERY,
    PROBE_BUDGET,
    DraftLengthController,
    first_probe_every,
)
from specdec_plugin.adaptive.cost_model import CostTable
from specdec_plugin.adaptive.probe_cost import PROBE_WINDOW, ProbeCost

K = 4
PLAIN = 5.0e-3


def _plain_steps(cost, n, count, seconds=PLAIN):
    for _ in range(count):
        cost.step(n, seconds, steady=True, plain=True, probe=False)


def _probe(cost, n, window):
    """A probe's drafting step and the steps after it (``window`` intervals)."""
    cost.step(n, window[0], steady=True, plain=False, probe=True)
    for seconds in window[1:]:
        # The verifying step is not plain; the drained step after it is, but its interval
        # belongs to the probe's window.
        cost.step(n, seconds, steady=True, plain=True, probe=False)


def test_a_probe_is_priced_over_its_window_in_plain_steps():
    cost = ProbeCost()
    plain = random.uniform(3e-3, 8e-3)
    _plain_steps(cost, 64, 12, plain)
    assert cost.extra_steps(64) is None  # no probe yet
    # Session 48's EAGLE probe at batch 64 (H200), as ratios of a plain step: drafting 1.16,
    # verifying 1.24, the drained step 0.96, then 1.01.
    ratios = [1.16, 1.24, 0.96, 1.01]
    _probe(cost, 64, [r * plain for r in ratios])
    assert cost.extra_steps(64) == pytest.approx(sum(ratios) - PROBE_WINDOW)
    # The window's steps are not plain samples: the plain step stays what it was.
    _probe(cost, 64, [r * plain for r in ratios])
    assert cost.extra_steps(64) == pytest.approx(sum(ratios) - PROBE_WINDOW)


def test_the_median_of_the_last_probes_and_never_below_zero():
    cost = ProbeCost(history=3)
    _plain_steps(cost, 8, 10)
    for extra in (0.2, 0.9, 0.4, 5.0):  # the first falls out of a history of 3
        _probe(cost, 8, [PLAIN * (1 + extra)] + [PLAIN] * (PROBE_WINDOW - 1))
    assert cost.extra_steps(8) == pytest.approx(0.9)
    cheap = ProbeCost()
    _plain_steps(cheap, 8, 10)
    _probe(cheap, 8, [PLAIN * 0.5] + [PLAIN] * (PROBE_WINDOW - 1))
    assert cheap.extra_steps(8) == 0.0


@pytest.mark.parametrize("break_at", range(1, PROBE_WINDOW))
@pytest.mark.parametrize("how", ["unsteady", "untimed", "batch size", "another probe"])
def test_a_window_that_is_not_steady_prices_nothing(break_at, how):
    cost = ProbeCost()
    _plain_steps(cost, 16, 10)
    cost.step(16, 2 * PLAIN, steady=True, plain=False, probe=True)
    for i in range(1, PROBE_WINDOW):
        n, seconds, steady, probe = 16, 2 * PLAIN, True, False
        if i == break_at:
            if how == "unsteady":
                steady = False  # a request arrived, or the engine sat idle
            elif how == "untimed":
                seconds = None
            elif how == "batch size":
                n = 15
            else:
                probe = True
        cost.step(n, seconds, steady=steady, plain=False, probe=probe)
    assert cost.extra_steps(16) is None
    assert cost.extra_steps(15) is None


def test_no_price_without_plain_steps_at_that_batch_size():
    cost = ProbeCost(min_plain=8)
    _plain_steps(cost, 16, 20)
    _plain_steps(cost, 64, 7)
    _probe(cost, 64, [2 * PLAIN] * PROBE_WINDOW)
    assert cost.extra_steps(64) is None  # 7 plain steps at 64 are too few; 16's do not count
    _plain_steps(cost, 64, 1)
    _probe(cost, 64, [2 * PLAIN] * PROBE_WINDOW)
    assert cost.extra_steps(64) == pytest.approx(PROBE_WINDOW)
    with pytest.raises(ValueError):
        ProbeCost(window=0)


# Target forward times by token count, flat to 64 tokens then steep (tests/test_adaptive_probes.py):
# the table prices a probe at batch 64 at about 0.4 of a plain step.
STEEP = CostTable((1, 64, 128, 320), (6.0e-3, 6.2e-3, 8.4e-3, 14.0e-3))


def _drive(controller, batch, steps, window_ratios):
    """``steps`` engine steps of ``batch``, every draft rejected, each step's interval told
    to the controller as the scheduler does (a plain step 6.2 ms; a probe's window
    ``window_ratios`` of it). Returns the steps whose drafts were probes."""
    probes, window, last_k = [], [], 0
    for i in range(steps):
        before = controller.probes
        k = controller.choose(batch)
        probe = controller.probes != before
        if probe:
            probes.append(i)
            window = list(window_ratios)
        ratio = window.pop(0) if window else 1.0
        controller.observe_interval(len(batch), ratio * 6.2e-3, True, k == 0 and last_k == 0,
                                    probe)
        if k:
            for req in batch:
                controller.observe(req, k, 0)
        last_k = k
    return probes


def test_the_budget_spaces_probes_by_their_measured_cost():
    batch = [f"r{i}" for i in range(64)]
    dear = [1.2, 1.4, 1.3, 1.1]  # 1.0 plain step over the window: more than the table's 0.4
    priced = DraftLengthController(K, STEEP, learn_costs=False).cost
    table_first = first_probe_every(priced.step_time(64, 1), priced.step_time(64, 0), PROBE_BUDGET)
    seen_first = first_probe_every(1.0 + sum(dear) - PROBE_WINDOW, 1.0, PROBE_BUDGET)
    assert 2 * table_first < seen_first and 2 * seen_first <= MAX_PROBE_EVERY
    gaps = {}
    for measure in (False, True):
        controller = DraftLengthController(K, STEEP, learn_costs=False, measure_probes=measure)
        probes = _drive(controller, batch, 1500, dear)
        gaps[measure] = [b - a for a, b in zip(probes, probes[1:])]
    # Table: each interval twice the last (the table's first interval, doubled).
    assert gaps[False][:2] == [2 * table_first, 4 * table_first], gaps
    # Measured: the first probe was priced by the table (nothing measured yet); from the
    # second on the budget reads what the first cost.
    assert gaps[True][0] == 2 * table_first, gaps
    assert gaps[True][1] == 2 * seen_first, gaps


def test_the_table_prices_probes_where_nothing_was_measured():
    batch = [f"r{i}" for i in range(64)]
    plain = DraftLengthController(K, STEEP, learn_costs=False)
    measured = DraftLengthController(K, STEEP, learn_costs=False, measure_probes=True)
    # Probes whose windows never complete steadily (a request arrives in each): no price.
    for controller in (plain, measured):
        for i in range(400):
            before = controller.probes
            k = controller.choose(batch)
            controller.observe_interval(64, 6.2e-3, i % 3 != 0, k == 0,
                                        controller.probes != before)
            for req in batch if k else ():
                controller.observe(req, k, 0)
    assert measured.probe_cost.extra_steps(64) is None
    assert measured.probes == plain.probes and measured.probe_every == plain.probe_every


class _FakeVllmScheduler:
    """Stands in for vLLM's scheduler under the mixin: ``schedule`` asks the controller for the
    step's draft length as vLLM's ``dynamic_sd_lookup`` does, and makes a pure decode output
    of the running batch (``tests/test_adaptive_step_timing.py``'s shape)."""

    def schedule(self):
        k = self.dynamic_sd_lookup[len(self.running)]
        verify = self._verify
        self._verify = k
        tokens = {r.request_id: 1 + verify for r in self.running}
        spec = {r.request_id: [-1] * verify for r in self.running} if verify else {}
        return SimpleNamespace(
            scheduled_new_reqs=[], scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set()),
            num_scheduled_tokens=tokens, scheduled_spec_decode_tokens=spec,
            total_num_scheduled_tokens=sum(tokens.values()), num_spec_tokens_to_schedule=k,
            num_invalid_spec_tokens=None)

    def update_from_output(self, scheduler_output, model_runner_output):
        for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
            self.draft_controller.observe(req_id, len(drafts), 0)  # every draft rejected
        return {}


def test_the_scheduler_tells_the_controller_every_interval_and_which_steps_were_probes():
    from specdec_plugin.adaptive.scheduler import AdaptiveSchedulerMixin, _AskController
    from specdec_plugin.adaptive.step_timing import StepTimer

    class Scheduler(AdaptiveSchedulerMixin, _FakeVllmScheduler):
        pass

    # The mixin's own state, as its __init__ sets it (that one needs a vLLM config).
    scheduler = Scheduler.__new__(Scheduler)
    scheduler.draft_controller = DraftLengthController(K, STEEP, learn_costs=False,
                                                       probe_budget=0.0, measure_probes=True)
    scheduler.dynamic_sd_lookup = _AskController(scheduler)
    scheduler._step_timer = StepTimer(lambda n, k: 1.0)  # no interval is an idle gap
    scheduler._probe_outputs = []
    scheduler.running = [SimpleNamespace(request_id=f"r{i}") for i in range(8)]
    scheduler._verify = 0
    told = []
    observe = scheduler.draft_controller.observe_interval

    def record(n, seconds, steady, plain, probe):
        told.append((n, seconds, steady, plain, probe))
        observe(n, seconds, steady, plain, probe)

    scheduler.draft_controller.observe_interval = record
    chosen = []
    for _ in range(200):  # synchronous: schedule, then the result
        before = scheduler.draft_controller.probes
        out = scheduler.schedule()
        chosen.append((out.num_spec_tokens_to_schedule, scheduler.draft_controller.probes != before))
        scheduler.update_from_output(out, None)
    assert len(told) == len(chosen)
    # The first result has no interval before it; every later one is timed and steady.
    assert told[0][1] == 0.0 and all(t[0] == 8 and t[1] > 0 and t[2] for t in told[1:])
    # Probe flags reach the controller at the steps whose drafts were probes, and only there.
    assert [t[4] for t in told] == [probe for _, probe in chosen]
    assert sum(t[4] for t in told) == scheduler.draft_controller.probes >= 3
    # Plain: the step neither verified drafts nor drafted.
    verified = [0] + [k for k, _ in chosen[:-1]]
    assert [t[3] for t in told[1:]] == [v == 0 and k == 0 for v, (k, _) in
                                        zip(verified[1:], chosen[1:])]
    assert scheduler._probe_outputs == []


def test_cuda_prices_probes_by_their_measured_cost_and_the_cpu_by_the_table(monkeypatch):
    # H200, session 54: one probe a run instead of two or three at batch 64, suffix's decode
    # 1.011 -> 1.001 of plain decoding. The CPU's rounds could not tell the two apart.
    from specdec_plugin import envs
    from specdec_plugin.device.cpu import CpuDevice
    from specdec_plugin.device.cuda import CudaDevice

    assert CudaDevice.process_env["SPECDEC_ADAPTIVE_PROBE_COST"] == "observed"
    assert "SPECDEC_ADAPTIVE_PROBE_COST" not in CpuDevice.process_env
    monkeypatch.delenv("SPECDEC_ADAPTIVE_PROBE_COST", raising=False)
    assert envs.adaptive_probe_cost() == "table"
    monkeypatch.setenv("SPECDEC_ADAPTIVE_PROBE_COST", CudaDevice.process_env[
        "SPECDEC_ADAPTIVE_PROBE_COST"])
    assert envs.adaptive_probe_cost() == "observed"
