"""Holding a drafting length (adaptive/policy.py, ``switch_gain``; SPECDEC_ADAPTIVE_SWITCH_GAIN):
while drafting at length c, another drafting length replaces c only for a clear gain. Without
it the shorter-first rule picks afresh every step (session 37: lengths 3 and 4 scored within
1% at batch 32 on the H200)."""
from __future__ import annotations

import numpy as np
import pytest

from specdec_plugin.adaptive.controller import DraftLengthController
from specdec_plugin.adaptive.policy import choose_draft_length, expected_tokens

K = 4
RATE = 0.7  # the controller's prior rate: a fresh controller sees exactly this at every position


class StepTimes:
    """Step times by draft length alone, with length 3 ``edge`` better than 4 per second."""

    def __init__(self, edge: float):
        e = expected_tokens(np.full((1, K), RATE), 3)[0], expected_tokens(np.full((1, K), RATE), 4)[0]
        # Length 3 beats 2 by 3.7%, more than the shorter-first rule's 3%.
        self.seconds = {0: 1.0, 1: 1.15, 2: 1.3, 3: 1.45}
        self.seconds[4] = e[1] / (e[0] / 1.45) * (1.0 + edge)

    def step_time(self, num_reqs: int, k: int) -> float:
        return self.seconds[k]


def choose(edge, current, switch_gain=0.03, rate=RATE, **kw):
    rates = np.full((8, K), rate)
    return choose_draft_length(rates, StepTimes(edge), range(K + 1), current=current,
                               switch_gain=switch_gain, **kw).k


def test_without_a_hold_a_one_percent_edge_goes_to_the_shorter_length():
    assert choose(0.01, current=4, switch_gain=None) == 3
    assert choose(0.01, current=None, switch_gain=None) == 3


def test_a_hold_keeps_the_current_length_against_a_small_edge():
    assert choose(0.01, current=4) == 4
    assert choose(-0.01, current=3) == 3  # 4 is 1% better: 3 is kept as well


def test_a_clear_gain_replaces_the_held_length():
    assert choose(0.05, current=4) == 3
    assert choose(-0.05, current=3, min_gain=0.0) == 4
    assert choose(0.01, current=1) == 3  # 1 is far behind: no hold saves it


class BarelyWorthIt:
    """Every drafting length 1% slower per token than a plain step."""

    def step_time(self, num_reqs: int, k: int) -> float:
        return expected_tokens(np.full((1, K), RATE), k)[0] / (0.99 if k else 1.0)


def test_turning_off_and_resuming_are_not_held():
    assert choose(0.01, current=4, rate=0.0) == 0  # drafts never land: off, whatever was drafted
    # Drafting 1% worse than plain steps: off, although 4 is within the switch gain of it.
    rates = np.full((8, K), RATE)
    assert choose_draft_length(rates, BarelyWorthIt(), range(K + 1), current=4,
                               switch_gain=0.03).k == 0
    # Resuming from plain steps follows the resume rule alone.
    assert choose(0.01, current=0, drafting=False) == choose(0.01, current=0, switch_gain=None,
                                                             drafting=False)


def test_a_barred_length_is_not_held():
    # Two requests accept far less: length 4 would make them slower than plain steps (1.53
    # expected tokens against a step 1.57x a plain one); 2 and 3 would not.
    rates = np.vstack([np.full((6, K), RATE), np.full((2, K), 0.35)])
    times = StepTimes(-0.01)
    unheld = choose_draft_length(rates, times, range(K + 1), protect_quantile=0.1).k
    held = choose_draft_length(rates, times, range(K + 1), current=4, switch_gain=0.03,
                               protect_quantile=0.1).k
    assert held == unheld == 2
    assert choose_draft_length(rates, times, range(K + 1), current=4, switch_gain=0.03).k == 4


@pytest.mark.parametrize("switch_gain, expected", [(None, 3), (0.03, 4)])
def test_the_controller_holds_the_length_it_drafted_last(switch_gain, expected):
    controller = DraftLengthController(K, StepTimes(0.01), switch_gain=switch_gain)
    controller.last_k = 4  # it drafted 4 tokens last step
    assert controller.choose(["a", "b"]) == expected


def test_a_kept_decision_is_not_reused_for_another_current_length():
    # Without observed costs the controller keeps its last decision while its inputs stay the
    # same: the length it drafted last is one of them.
    controller = DraftLengthController(K, StepTimes(0.01), learn_costs=False, switch_gain=0.03)
    controller.last_k = 4
    assert controller.choose(["a", "b"]) == 4
    controller.last_k = 3
    assert controller.choose(["a", "b"]) == 3


@pytest.mark.parametrize("variable, read", [
    ("SPECDEC_ADAPTIVE_SWITCH_GAIN", "adaptive_switch_gain"),
    ("SPECDEC_ADAPTIVE_LENGTH_GAIN", "adaptive_length_gain")])
def test_the_margin_settings_between_drafting_lengths(monkeypatch, variable, read):
    """This hold and the margin of tests/test_adaptive_length_gain.py: unset None, a number
    read, anything else refused naming the variable."""
    from specdec_plugin import envs

    monkeypatch.delenv(variable, raising=False)
    assert getattr(envs, read)() is None
    monkeypatch.setenv(variable, "0.05")
    assert getattr(envs, read)() == 0.05
    monkeypatch.setenv(variable, "lots")
    with pytest.raises(ValueError, match=variable):
        getattr(envs, read)()
