"""The start-up cost table's monotone fix-up (adaptive/measure.py): a slow point must not be
carried into larger sizes, and the result never decreases with the token count."""
from __future__ import annotations

import random

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
