"""The cost table corrected by measured step times (specdec_plugin/adaptive/calibration.py),
without an engine: step times in, factors and the controller's choice out."""
from __future__ import annotations

import pytest

from specdec_plugin.adaptive.calibration import (
    MAX_FACTOR,
    MIN_SAMPLES,
    CalibratedCost,
    StepCostCalibration,
    batch_bucket,
    steady_decode_step,
)
from specdec_plugin.adaptive.controller import DraftLengthController
from specdec_plugin.adaptive.cost_model import CostTable

# A CPU-like table: verification of a few more tokens is nearly free, the drafter cheap.
CPU_TABLE = CostTable((1, 8, 16, 32), (30e-3, 32e-3, 37e-3, 58e-3), (0.6e-3, 0.95e-3, 1.25e-3, 1.75e-3),
                      drafter_syncs_at_zero=True)


def test_batch_buckets_are_powers_of_two():
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 64, 65)] == [1, 2, 4, 4, 8, 8, 16, 64, 128]


def test_factor_needs_samples_then_follows_them_and_is_clipped():
    cal = StepCostCalibration()
    assert cal.factor(8, 1) == 1.0
    for _ in range(MIN_SAMPLES - 1):
        cal.record(8, 1, 0.06, 0.04)
    # Not enough samples of its own, but drafting lengths at the bucket share theirs.
    assert cal.factor(8, 1) == pytest.approx(1.5)
    assert cal.factor(8, 3) == pytest.approx(1.5)
    assert cal.factor(8, 0) == 1.0  # a plain step never borrows from drafting steps
    assert cal.factor(2, 1) == 1.0  # nor another batch bucket
    cal.record(8, 1, 0.06, 0.04)
    assert cal.factor(8, 1) == pytest.approx(1.5)
    cal.record(8, 1, 100.0, 0.04)  # one stalled step: clipped, then decayed
    assert 1.5 < cal.factor(8, 1) < MAX_FACTOR * 0.2 + 1.5
    cal.record(8, 0, -1.0, 0.04)  # nonsense is ignored
    assert cal.factor(8, 0) == 1.0


def test_calibrated_cost_scales_the_table():
    cal = StepCostCalibration()
    cost = CalibratedCost(CPU_TABLE, cal)
    for _ in range(MIN_SAMPLES):
        cal.record(8, 1, 2 * CPU_TABLE.step_time(8, 1), CPU_TABLE.step_time(8, 1))
    assert cost.step_time(8, 1) == pytest.approx(2 * CPU_TABLE.step_time(8, 1))
    assert cost.step_time(8, 0) == pytest.approx(CPU_TABLE.step_time(8, 0))


def test_steady_decode_steps_only():
    assert steady_decode_step({"a": 3, "b": 3}, {"a": [1, 2], "b": [5, 6]}, 2) == (2, 2)
    assert steady_decode_step({"a": 1, "b": 1}, {}, 0) == (2, 0)
    assert steady_decode_step({"a": 3, "b": 1}, {"a": [1, 2]}, 2) == (2, 2)  # n-gram: no match for b
    assert steady_decode_step({"a": 3, "b": 40}, {"a": [1, 2]}, 2) is None  # b is a prefill chunk
    assert steady_decode_step({"a": 3}, {"a": [1, 2]}, 3) is None  # verifies 2, drafts 3
    assert steady_decode_step({}, {}, 0) is None


def test_controller_stops_drafting_when_drafting_steps_run_slower_than_the_table_says():
    """The CPU case (2026-11-25, EAGLE-3 at batch 8): the table says one draft token pays at
    these acceptance rates; the engine's drafting steps take 1.5x the table's time while its
    plain steps match it, so drafting loses, and the controller must see it."""
    ids = [f"r{i}" for i in range(8)]
    ctl = DraftLengthController(3, CPU_TABLE)
    for step in range(20):
        for i, r in enumerate(ids):
            ctl.observe(r, 1, 1 if (i + step) % 5 < 2 else 0)  # 40% of first drafts land
    before = ctl.choose(ids)
    assert before > 0  # the table alone says drafting pays
    for _ in range(MIN_SAMPLES):
        for k in range(1, 4):
            ctl.observe_step(8, k, 1.5 * CPU_TABLE.step_time(8, k))
        ctl.observe_step(8, 0, CPU_TABLE.step_time(8, 0))
    assert ctl.choose(ids) == 0
