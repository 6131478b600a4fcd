"""The margin between drafting lengths (adaptive/policy.py, ``length_gain``;
SPECDEC_ADAPTIVE_LENGTH_GAIN): by default a longer drafting length must beat the best shorter
one by min_gain (3%), as drafting must beat a plain step; with length_gain the margin between
drafting lengths is its own, and 0 picks the best drafting length. Session 42's H200 run: 4
drafts about 2.6% ahead of 3 at batch 1, and the engine drafted 3. Since session 43 EAGLE-3's
default is 0 (adaptive/config.py DEFAULT_LENGTH_GAIN), the other methods keep min_gain."""
from __future__ import annotations

import random

import numpy as np
import pytest

from specdec_plugin.adaptive.controller import DraftLengthController
from specdec_plugin.adaptive.policy import BatchTokens, choose_draft_length, decide, expected_tokens

K = 4
RATE = 0.7  # a fresh controller's prior at every position


class Seconds:
    """Step times that give each length the tokens per second in ``scores`` for one request
    at acceptance RATE."""

    def __init__(self, scores: dict[int, float]):
        tokens = {k: expected_tokens(np.full((1, K), RATE), k)[0] for k in scores}
        self.seconds = {k: tokens[k] / scores[k] for k in scores}

    def step_time(self, num_reqs: int, k: int) -> float:
        return self.seconds[k]


def _choose(scores: dict[int, float], **kw) -> int:
    return choose_draft_length(np.full((1, K), RATE), Seconds(scores), range(K + 1), **kw).k


def test_by_default_a_longer_draft_needs_three_percent_over_a_shorter_one():
    scores = {0: 1.0, 1: 1.10, 2: 1.12, 3: 1.15, 4: 1.17}  # 4 is 1.7% ahead of 3
    assert _choose(scores) == 3
    assert _choose(scores, length_gain=0.03) == 3
    assert _choose(scores, length_gain=0.0) == 4


def test_with_no_margin_the_best_drafting_length_is_chosen():
    for _ in range(100):
        scores = {0: 1.0, **{k: random.uniform(1.05, 2.0) for k in range(1, K + 1)}}
        best = max(range(1, K + 1), key=lambda k: (scores[k], -k))  # ties: the shorter
        assert _choose(scores, length_gain=0.0) == best


def test_drafting_still_needs_min_gain_over_plain_steps():
    # Every drafting length within 3% of a plain step: plain, however they rank.
    scores = {0: 1.0, 1: 1.01, 2: 1.02, 3: 1.025, 4: 1.029}
    assert _choose(scores, length_gain=0.0) == 0
    # Resuming still needs resume_gain (10%).
    scores = {0: 1.0, 1: 1.05, 2: 1.06, 3: 1.08, 4: 1.09}
    assert _choose(scores, length_gain=0.0, drafting=False) == 0
    assert _choose(scores, length_gain=0.0, drafting=True) == 4


def test_without_plain_steps_allowed_every_comparison_uses_the_length_margin():
    batch = BatchTokens(1, K, {2: 1.0, 3: 1.02, 4: 1.04})
    ones = type("Ones", (), {"step_time": lambda self, n, k: 1.0})()
    assert decide(batch, ones).k == 4  # 1.04 > 1.0 * 1.03
    assert decide(batch, ones, min_gain=0.05).k == 2
    assert decide(batch, ones, min_gain=0.05, length_gain=0.0).k == 4


@pytest.mark.parametrize("length_gain, expected", [(None, 3), (0.0, 4)])
def test_the_controller_passes_its_margin_to_the_policy(length_gain, expected):
    seconds = Seconds({0: 1.0, 1: 1.10, 2: 1.12, 3: 1.15, 4: 1.17})
    controller = DraftLengthController(K, seconds, learn_costs=False, length_gain=length_gain)
    assert controller.choose(["a", "b"]) == expected


def test_eagle3_picks_its_best_drafting_length_by_default_other_methods_keep_the_margin(
        monkeypatch):
    from specdec_plugin.adaptive.config import controller_settings

    monkeypatch.delenv("SPECDEC_ADAPTIVE_LENGTH_GAIN", raising=False)
    seconds = Seconds({0: 1.0, 1: 1.10, 2: 1.12, 3: 1.15, 4: 1.17})  # 4 is 1.7% ahead of 3
    chosen = {method: DraftLengthController(
        K, seconds, **{**controller_settings(method), "learn_costs": False}).choose(["a"])
        for method in ("eagle3", "eagle", "draft_model", "mtp", "ngram", "ngram_gpu", "suffix")}
    assert chosen == {"eagle3": 4, "eagle": 3, "draft_model": 3, "mtp": 3, "ngram": 3,
                      "ngram_gpu": 3, "suffix": 3}


@pytest.mark.parametrize("setting", ["0.03", "0", "0.05"])
def test_the_users_margin_wins_over_every_methods_default(monkeypatch, setting):
    from specdec_plugin.adaptive.config import controller_settings

    monkeypatch.setenv("SPECDEC_ADAPTIVE_LENGTH_GAIN", setting)
    for method in ("eagle3", "eagle", "ngram", "suffix"):
        assert controller_settings(method)["length_gain"] == float(setting)


def test_every_controller_setting_reaches_the_controller_the_scheduler_builds(monkeypatch):
    """The scheduler builds its controller from ``controller_settings`` (adaptive/config.py):
    each environment setting, this margin among them, arrives in the controller."""
    from specdec_plugin.adaptive.config import controller_settings
    from specdec_plugin.adaptive.cost_model import CostTable

    values = {"SPECDEC_ADAPTIVE_RESUME_GAIN": 0.2, "SPECDEC_ADAPTIVE_PROTECT": 0.25,
              "SPECDEC_ADAPTIVE_PROBE_BUDGET": 0.01, "SPECDEC_ADAPTIVE_SWITCH_GAIN": 0.04,
              "SPECDEC_ADAPTIVE_LENGTH_GAIN": random.choice([0.0, 0.02])}
    for name, value in values.items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("SPECDEC_ADAPTIVE_OBSERVED_COST", "eagle3")
    monkeypatch.setenv("SPECDEC_ADAPTIVE_OBSERVED_ESTIMATOR", "iqm")
    monkeypatch.delenv("SPECDEC_ADAPTIVE_PROBE_COST", raising=False)
    table = CostTable((1, 64), (1e-3, 2e-3))
    controller = DraftLengthController(K, table, **controller_settings("eagle3"))
    assert (controller.resume_gain, controller.protect_quantile, controller.probe_budget,
            controller.switch_gain, controller.length_gain) == tuple(values.values())
    assert controller.observed_cost.settings.estimator == "iqm"
    assert DraftLengthController(K, table, **controller_settings("ngram")).observed_cost is None
    assert controller.probe_cost is None  # the table prices probes unless asked
    monkeypatch.setenv("SPECDEC_ADAPTIVE_PROBE_COST", "Observed")
    assert DraftLengthController(K, table, **controller_settings("ngram")).probe_cost is not None
