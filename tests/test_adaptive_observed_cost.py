"""The cost table corrected by observed step times (specdec_plugin/adaptive/observed_cost.py):
deterministic, no engine."""
from __future__ import annotations

import numpy as np
import pytest

from specdec_plugin.adaptive.cost_model import CostTable
from specdec_plugin.adaptive.observed_cost import ObservedCost, ObservedCostSettings
from specdec_plugin.adaptive.policy import choose_draft_length

K = 4
# n-gram on a memory-bound GPU (as in test_adaptive_policy.py): drafting looks nearly free.
NGRAM_LIKE = CostTable((1, 64, 256, 1024), (6.0e-3, 6.3e-3, 9.0e-3, 30.0e-3))
MIN_OBS = ObservedCostSettings().min_observations


def _feed(cost: ObservedCost, n: int, k: int, factor: float, steps: int) -> None:
    for _ in range(steps):
        assert cost.observe(n, k, factor * NGRAM_LIKE.step_time(n, k))


def test_without_observations_the_table_stands():
    cost = ObservedCost(NGRAM_LIKE)
    for n in (1, 16, 300):
        for k in range(K + 1):
            assert cost.step_time(n, k) == NGRAM_LIKE.step_time(n, k)


def test_step_times_kept_between_observations_are_the_formula_s():
    """step_time keeps each batch size's corrected times until the next observation (the
    policy reads every length each step): after any stream of observations and queries it
    returns exactly max_j<=k table(n, j) * factor(j)."""
    import random

    rng = random.Random()
    cost = ObservedCost(NGRAM_LIKE)
    for _ in range(400):
        if rng.random() < 0.4:
            n, k = rng.choice((1, 3, 16, 64, 300)), rng.randrange(K + 1)
            cost.observe(n, k, rng.uniform(0.4, 4.0) * NGRAM_LIKE.step_time(n, k))
        for _ in range(rng.randrange(1, 4)):
            n, k = rng.choice((1, 2, 16, 64, 65, 300)), rng.randrange(K + 1)
            assert cost.step_time(n, k) == max(NGRAM_LIKE.step_time(n, j) * cost.factor(j)
                                               for j in range(k + 1))
    with pytest.raises(ValueError, match="negative"):
        cost.step_time(4, -1)


def test_a_factor_is_applied_only_after_enough_observations_and_converges():
    cost = ObservedCost(NGRAM_LIKE)
    _feed(cost, 16, 2, 2.0, MIN_OBS - 1)
    assert cost.factor(2) == 1.0
    _feed(cost, 16, 2, 2.0, 1)
    assert cost.factor(2) == pytest.approx(2.0)
    # The cost moves (host load goes away): the median follows within a window of steps.
    _feed(cost, 16, 2, 1.2, ObservedCostSettings().window)
    assert cost.factor(2) == pytest.approx(1.2, rel=0.01)
    # The factor is per length, whatever the batch size it was learned at.
    assert cost.step_time(64, 2) == pytest.approx(1.2 * NGRAM_LIKE.step_time(64, 2), rel=0.01)


def test_noise_averages_out_in_log_space():
    cost = ObservedCost(NGRAM_LIKE)
    for i in range(200):
        ratio = 1.5 * (1.25 if i % 2 else 0.8)  # geometric mean 1.5
        cost.observe(8, 1, ratio * NGRAM_LIKE.step_time(8, 1))
    assert cost.factor(1) == pytest.approx(1.5, rel=0.02)


@pytest.mark.parametrize("estimator", ["median", "iqm"])
def test_intervals_of_a_few_steps_do_not_move_the_factor(estimator):
    # Seen on an H100 (session 23): among steps at about the table's time, intervals of 3-5x a
    # step (under discard_ratio). A fading mean followed them; the median does not until they
    # are half of the window, the interquartile mean not while they are a quarter of it.
    window = ObservedCostSettings().window
    cost = ObservedCost(NGRAM_LIKE, ObservedCostSettings(estimator=estimator))
    _feed(cost, 1, 4, 1.0, window)
    for _ in range(3):
        _feed(cost, 1, 4, 4.5, 1)
        _feed(cost, 1, 4, 1.0, 2)
    assert cost.factor(4) == pytest.approx(1.0)
    assert cost.changes(range(K + 1)) == []
    # A cost that really moved is followed once it is most of the recent steps.
    _feed(cost, 1, 4, 1.6, window // 2 + 1 if estimator == "median" else window * 3 // 4)
    assert cost.factor(4) == pytest.approx(1.6)


def test_two_groups_of_step_times_move_the_median_between_them_not_the_iqm():
    # Seen on an H100 (session 24, suffix): 1-token steps at about 0.9x and 1.3x the table, in
    # runs of a few; the median's factor jumped between the two every nine or so steps.
    rng = np.random.default_rng()
    pattern, group = [], 0
    while len(pattern) < 400:
        pattern += [(0.9, 1.3)[group]] * int(rng.integers(1, 5))
        group = 1 - group
    jumps = {}
    for estimator in ("median", "iqm"):
        cost = ObservedCost(NGRAM_LIKE, ObservedCostSettings(estimator=estimator))
        factors = []
        for seen, ratio in enumerate(pattern, 1):
            _feed(cost, 16, 1, ratio, 1)
            if seen >= ObservedCostSettings().window:  # a full window: one in, one out
                factors.append(cost.factor(1))
        steps = np.exp(np.abs(np.diff(np.log(factors))))
        jumps[estimator] = float(steps.max())
    # One observation in, one out: the mean of the middle half moves by at most an eighth of
    # the gap between the groups (1.3 / 0.9 = 1.44 -> 1.047); the median crosses half of it
    # (1.20) at once whenever the window's mix passes eight and eight.
    assert jumps["iqm"] <= (1.3 / 0.9) ** (1 / 8) + 1e-9
    assert jumps["median"] >= (1.3 / 0.9) ** (1 / 2) - 1e-9


def test_an_unknown_estimator_is_refused():
    with pytest.raises(ValueError, match="estimator 'mean'"):
        ObservedCost(NGRAM_LIKE, ObservedCostSettings(estimator="mean"))


def test_unobserved_lengths_borrow_from_the_nearest_drafting_length_else_from_plain_steps():
    cost = ObservedCost(NGRAM_LIKE)
    _feed(cost, 16, 0, 1.3, MIN_OBS)
    # Only plain steps seen (e.g. host load): drafting lengths borrow k = 0's factor, so
    # drafting is neither favoured nor penalised.
    assert [cost.factor(k) for k in range(K + 1)] == pytest.approx([1.3] * (K + 1))
    _feed(cost, 16, 4, 2.0, MIN_OBS)
    _feed(cost, 16, 1, 3.0, MIN_OBS)
    assert cost.factor(0) == pytest.approx(1.3)
    assert cost.factor(4) == pytest.approx(2.0)
    assert cost.factor(3) == pytest.approx(2.0)  # nearest: 4
    assert cost.factor(2) == pytest.approx(3.0)  # nearest observed: 1 (4 is farther)
    # k = 0 unobserved: the table's where drafting was seen to cost more (the policy then
    # picks 0 soon enough to observe it) ...
    dearer = ObservedCost(NGRAM_LIKE)
    _feed(dearer, 16, K, 2.0, MIN_OBS)
    assert dearer.factor(0) == 1.0
    assert dearer.factor(1) == pytest.approx(2.0)
    # ... and the drafting factor where it was seen to cost less: the table is off in scale
    # (the fallback table's units, host load at start-up), and an unknown must not make
    # drafting look better than the table says.
    cheaper = ObservedCost(NGRAM_LIKE)
    _feed(cheaper, 16, K, 0.6, MIN_OBS)
    _feed(cheaper, 16, 2, 0.7, MIN_OBS)
    assert cheaper.factor(0) == pytest.approx(0.7)  # the shortest observed drafting length's


def test_factors_are_clamped_and_stalls_are_dropped():
    s = ObservedCostSettings()
    cost = ObservedCost(NGRAM_LIKE)
    _feed(cost, 4, 3, 8.0, MIN_OBS)  # under discard_ratio: used, but clamped
    assert cost.factor(3) == s.max_factor
    _feed(cost, 4, 0, 0.1, MIN_OBS)
    assert cost.factor(0) == s.min_factor
    # A ratio past discard_ratio (an idle gap, a stall) is not evidence.
    fresh = ObservedCost(NGRAM_LIKE)
    assert not fresh.observe(4, 2, 50 * NGRAM_LIKE.step_time(4, 2))
    assert not fresh.observe(4, 2, 0.0)
    assert fresh.observations == {}


def test_drafting_observed_at_twice_the_table_turns_drafting_off():
    # Prose with n-gram: drafts sometimes land. By the table, drafting pays; the engine then
    # observes that drafting steps cost 2x what the table says (vLLM runs them with piecewise
    # graphs), plain steps what it says.
    n = 16
    rates = np.tile([0.5, 0.3, 0.2, 0.1], (n, 1))
    cost = ObservedCost(NGRAM_LIKE)
    assert choose_draft_length(rates, cost, range(K + 1)).k > 0
    _feed(cost, n, K, 2.0, MIN_OBS)
    # Drafting lengths never run borrow K's factor: no walk through 3, 2, 1 first.
    assert choose_draft_length(rates, cost, range(K + 1)).k == 0
    _feed(cost, n, 0, 1.0, MIN_OBS)
    assert choose_draft_length(rates, cost, range(K + 1)).k == 0
    # Drafts that land often still pay at twice the cost.
    assert choose_draft_length(np.tile([0.9, 0.9, 0.9, 0.9], (n, 1)), cost, range(K + 1)).k == K
    # Host load that slows every step alike changes no decision.
    loaded = ObservedCost(NGRAM_LIKE)
    for k in range(K + 1):
        _feed(loaded, n, k, 2.0, MIN_OBS)
    assert (choose_draft_length(rates, loaded, range(K + 1)).k
            == choose_draft_length(rates, NGRAM_LIKE, range(K + 1)).k)
    # Drafting steps faster than the table (a table timed under load) with no plain step seen:
    # no tilt toward drafting, for acceptance where the table says not to draft (a plain step
    # at the table's time against drafting at half of it would draft).
    poor = np.tile([0.02, 0.0, 0.0, 0.0], (n, 1))
    fast = ObservedCost(NGRAM_LIKE)
    _feed(fast, n, K, 0.5, MIN_OBS)
    assert choose_draft_length(poor, NGRAM_LIKE, range(K + 1)).k == 0
    assert choose_draft_length(poor, fast, range(K + 1)).k == 0


def test_changes_report_moves_beyond_the_threshold_once():
    cost = ObservedCost(NGRAM_LIKE)
    _feed(cost, 16, 0, 1.1, MIN_OBS)
    _feed(cost, 16, 2, 2.0, MIN_OBS)
    moved = cost.changes(range(K + 1))
    assert [(k, before) for k, before, _ in moved] == [(2, 1.0)]
    assert moved[0][2] == pytest.approx(2.0)
    assert cost.changes(range(K + 1)) == []  # reported once
    _feed(cost, 16, 2, 2.2, 3)  # moves less than 25%: quiet
    assert cost.changes(range(K + 1)) == []
    _feed(cost, 16, 2, 1.0, 40)
    (k, before, now), = cost.changes(range(K + 1))
    assert k == 2 and before == pytest.approx(2.0) and now == pytest.approx(1.0, rel=0.02)


def test_the_controller_chooses_with_the_corrected_costs(caplog):
    from specdec_plugin.adaptive.controller import DraftLengthController

    n = 16
    req_ids = [f"r{i}" for i in range(n)]

    def drive(controller, steps):
        """Drafts land half the time at the first position, rarely deeper; every drafting step
        takes twice what the table says, plain steps what it says."""
        chosen = []
        for step in range(steps):
            k = controller.choose(req_ids)
            chosen.append(k)
            for i, req_id in enumerate(req_ids):
                if k:
                    controller.observe(req_id, k, min(k, 1 if (i + step) % 2 else 0))
            factor = 2.0 if k else 1.0
            controller.observe_step_time(n, k, factor * NGRAM_LIKE.step_time(n, k))
        return chosen

    learning = DraftLengthController(K, NGRAM_LIKE)
    with caplog.at_level("INFO", logger="specdec_plugin.adaptive.controller"):
        chosen = drive(learning, 200)
    # Drafting first (the table and an optimistic prior), then off once its cost is seen.
    assert chosen[0] > 0 and chosen[-50:].count(0) >= 45, chosen
    assert learning.cost.factor(chosen[0]) == pytest.approx(2.0)
    moved = [r.getMessage() for r in caplog.records if "start-up cost table" in r.getMessage()]
    assert moved and all("2.00x" in m for m in moved), moved
    # The table alone keeps drafting: acceptance 0.5 at the first position pays by it.
    trusting = DraftLengthController(K, NGRAM_LIKE, learn_costs=False)
    assert drive(trusting, 200)[-50:].count(0) == 0


def test_the_switch(monkeypatch):
    from specdec_plugin.adaptive.config import _check_observed_cost_methods, learns_step_costs
    from specdec_plugin.adaptive.controller import DraftLengthController

    # Unset: off (the CUDA device layer sets "suffix,eagle3" for its engine processes).
    monkeypatch.delenv("SPECDEC_ADAPTIVE_OBSERVED_COST", raising=False)
    assert not any(learns_step_costs(m) for m in ("ngram", "suffix", "eagle3"))
    monkeypatch.setenv("SPECDEC_ADAPTIVE_OBSERVED_COST", "1")
    assert all(learns_step_costs(m) for m in ("ngram", "ngram_gpu", "suffix", "eagle3"))
    monkeypatch.setenv("SPECDEC_ADAPTIVE_OBSERVED_COST", "suffix")
    assert learns_step_costs("suffix")
    assert not learns_step_costs("ngram") and not learns_step_costs("eagle3")
    # n-gram matched on the device goes by the user's name for the method.
    monkeypatch.setenv("SPECDEC_ADAPTIVE_OBSERVED_COST", "ngram, suffix")
    assert learns_step_costs("ngram_gpu") and learns_step_costs("suffix")
    _check_observed_cost_methods()
    monkeypatch.setenv("SPECDEC_ADAPTIVE_OBSERVED_COST", "0")
    assert not learns_step_costs("suffix")
    monkeypatch.setenv("SPECDEC_ADAPTIVE_OBSERVED_COST", "suffix,eagle-3")
    with pytest.raises(ValueError, match=r"SPECDEC_ADAPTIVE_OBSERVED_COST names \['eagle-3'\]"):
        _check_observed_cost_methods()
    from specdec_plugin.device.cuda import CudaDevice
    # On CUDA GPUs, suffix's (sessions 23-24) and EAGLE-3's (session 41: the table alone
    # drafted one token a step on code edits at batch 64, 1.065x static K).
    assert CudaDevice.process_env["SPECDEC_ADAPTIVE_OBSERVED_COST"] == "suffix,eagle3"
    # On CPUs, n-gram's (session 36: the table alone kept it from drafting at batch 4) and
    # EAGLE-3's (session 39: the table alone drafted chat at batch 8 slower than plain).
    from specdec_plugin.device.cpu import CpuDevice
    assert CpuDevice.process_env["SPECDEC_ADAPTIVE_OBSERVED_COST"] == "ngram,eagle3"
    # The estimator: the median unless asked; a name it does not know is refused with the
    # variable's name, where the config is built.
    from specdec_plugin import envs
    from specdec_plugin.adaptive.config import _check_observed_estimator

    monkeypatch.delenv("SPECDEC_ADAPTIVE_OBSERVED_ESTIMATOR", raising=False)
    assert envs.adaptive_observed_estimator() == "median"
    monkeypatch.setenv("SPECDEC_ADAPTIVE_OBSERVED_ESTIMATOR", "IQM")
    assert envs.adaptive_observed_estimator() == "iqm"
    _check_observed_estimator()
    monkeypatch.setenv("SPECDEC_ADAPTIVE_OBSERVED_ESTIMATOR", "mean")
    with pytest.raises(ValueError, match="SPECDEC_ADAPTIVE_OBSERVED_ESTIMATOR='mean'"):
        _check_observed_estimator()
    # Off: the policy reads the table itself, and step times change nothing.
    controller = DraftLengthController(K, NGRAM_LIKE, learn_costs=False)
    controller.observe_step_time(16, K, 10.0)
    assert controller.cost is NGRAM_LIKE and controller.observed_cost is None


def test_a_longer_draft_never_costs_less_than_a_shorter_one():
    rng = np.random.default_rng()
    cost = ObservedCost(NGRAM_LIKE)
    factors = rng.uniform(0.5, 2.0, K + 1)
    for k, factor in enumerate(factors):
        _feed(cost, int(rng.integers(1, 65)), k, float(factor), MIN_OBS)
    for n in rng.integers(1, 300, size=8):
        n = int(n)
        times = [cost.step_time(n, k) for k in range(K + 1)]
        assert times == sorted(times)
        raw = [NGRAM_LIKE.step_time(n, k) * cost.factor(k) for k in range(K + 1)]
        assert times == pytest.approx([max(raw[:k + 1]) for k in range(K + 1)])
    # Factors that keep the order change nothing.
    steady = ObservedCost(NGRAM_LIKE)
    base = float(rng.uniform(0.8, 1.2))
    for k in range(K + 1):
        _feed(steady, 16, k, base * (1 + 0.1 * k), MIN_OBS)
    assert steady.step_time(16, 3) == pytest.approx(base * 1.3 * NGRAM_LIKE.step_time(16, 3))


def test_no_drafting_with_nothing_accepted_when_probes_time_low():
    """Session 30 on the H100 (suffix, every draft rejected): the one-token probes' intervals
    fell in two groups, 0.7x and 1.3x of the table, and with the factor at 0.7x a one-token
    step looked cheaper than a plain one, so drafting turned on and off every few probes."""
    from specdec_plugin.adaptive.controller import DraftLengthController

    rng = np.random.default_rng()
    n = int(rng.integers(1, 17))
    req_ids = [f"r{i}" for i in range(n)]
    controller = DraftLengthController(K, NGRAM_LIKE)
    drafting_steps, probes_before = 0, 0
    low = True
    for step in range(3000):
        if step == 500:  # the optimistic start is over
            drafting_steps, probes_before = 0, controller.probes
        k = controller.choose(req_ids)
        if k:
            drafting_steps += 1
            for req_id in req_ids:
                controller.observe(req_id, k, 0)
            low = not low
            factor = (0.7 if low else 1.3) * float(rng.uniform(0.98, 1.02))
        else:
            factor = float(rng.uniform(0.98, 1.02))
        controller.observe_step_time(n, k, factor * NGRAM_LIKE.step_time(n, k))
    assert controller.observed_cost.learned(1)
    # After the start, the only drafting steps are the probes.
    assert drafting_steps == controller.probes - probes_before
