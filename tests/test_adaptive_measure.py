"""The start-up cost table's monotone fix-up (adaptive/measure.py): a slow point must not be
carried into larger sizes, and the result never decreases with the token count."""
from __future__ import annotations

import random

import pytest

from specdec_plugin.adaptive.measure import monotone


def test_a_slow_first_point_stays_where_it_was_measured():
    # Session 17's EAGLE-3 drafter row: one slow first pass, then the pass's real cost.
    assert monotone([0.78, 0.38, 0.38, 0.40, 0.46]) == [0.38, 0.38, 0.38, 0.40, 0.46]


def test_a_slow_middle_point_is_lowered_to_the_larger_sizes():
    assert monotone([7.1, 7.2, 9.9, 7.3, 8.4]) == [7.1, 7.2, 7.3, 7.3, 8.4]


def test_random_rows_become_non_decreasing_and_never_rise():
    for _ in range(50):
        row = [random.uniform(0.1, 10.0) for _ in range(random.randint(1, 16))]
        fixed = monotone(row)
        assert len(fixed) == len(row)
        assert all(a <= b for a, b in zip(fixed, fixed[1:]))
        assert all(f <= r for f, r in zip(fixed, row))
        assert fixed[-1] == row[-1]


def test_empty_row():
    assert monotone([]) == []


class _SlowSpellClock:
    """A fake clock and step: a step of t tokens takes ``t`` ms, three times that while the
    clock is inside the spell (another job on the cores)."""

    def __init__(self, spell_ms: tuple[float, float]):
        self.now_ms = 0.0
        self.spell_ms = spell_ms

    def perf_counter(self) -> float:
        return self.now_ms / 1e3

    def step(self, t: int) -> None:
        slow = self.spell_ms[0] <= self.now_ms < self.spell_ms[1]
        self.now_ms += t * (3.0 if slow else 1.0)


def test_a_slow_spell_over_one_counts_runs_does_not_reach_the_table(monkeypatch):
    from specdec_plugin.adaptive import measure

    counts = [1, 2, 4, 8, 16, 32, 64]
    # Without a spell the first round takes 2 * (1 + 2 + 4 + 8) = 30 ms up to 8 tokens; the
    # spell then covers all of 16 tokens' warm-up and first timing (and, back to back, the
    # rest of its runs too: 30 + 3 * 16 * 4 = 222 ms).
    clock = _SlowSpellClock(spell_ms=(30.0, 30.0 + 3 * 16 * 4))
    monkeypatch.setattr(measure.time, "perf_counter", clock.perf_counter)
    table = measure.measure_cost_table(clock.step, None, counts, budget_s=10.0, sync=lambda: None)
    assert table.token_counts == tuple(counts)
    assert list(table.target_s) == pytest.approx([t / 1e3 for t in counts])


def test_the_budget_cuts_the_counts_after_the_first_round(monkeypatch):
    from specdec_plugin.adaptive import measure

    clock = _SlowSpellClock(spell_ms=(0.0, 0.0))
    monkeypatch.setattr(measure.time, "perf_counter", clock.perf_counter)
    # Round 1 runs two parts twice, 4 * t ms per count: past half of a 200 ms budget after 16
    # tokens (124 ms; 60 ms after 8).
    table = measure.measure_cost_table(clock.step, clock.step, [1, 2, 4, 8, 16, 32, 64],
                                       budget_s=0.2, sync=lambda: None)
    assert table.token_counts == (1, 2, 4, 8, 16)
    expected = pytest.approx([t / 1e3 for t in (1, 2, 4, 8, 16)])
    assert list(table.drafter_s) == expected and list(table.target_s) == expected
