"""SPECDEC_ADAPTIVE_LENGTHS: the draft lengths the adaptive controller may choose from (K every
step through our scheduler, or a plain step or K); a bad value names the variable and the fix
where the engine config is built."""
from __future__ import annotations

import random

import pytest

from specdec_plugin import envs
from specdec_plugin.adaptive.config import controller_settings
from specdec_plugin.adaptive.controller import DraftLengthController
from specdec_plugin.adaptive.cost_model import CostTable

K = 4


def _controller(monkeypatch, setting: str | None) -> DraftLengthController:
    if setting is None:
        monkeypatch.delenv("SPECDEC_ADAPTIVE_LENGTHS", raising=False)
    else:
        monkeypatch.setenv("SPECDEC_ADAPTIVE_LENGTHS", setting)
    # A step of 64 tokens costs 3x a plain one: drafting pays while drafts land, not when not.
    plain = random.uniform(1e-3, 5e-3)
    table = CostTable((1, 64), (plain, 3 * plain))
    return DraftLengthController(K, table, **{**controller_settings("ngram"),
                                              "learn_costs": False})


@pytest.mark.parametrize("raw, lengths", [("4", (4,)), ("0,4", (0, 4)), (" 4, 0 ,4", (0, 4)),
                                          ("", None)])
def test_the_setting_reads_as_sorted_lengths(monkeypatch, raw, lengths):
    monkeypatch.setenv("SPECDEC_ADAPTIVE_LENGTHS", raw)
    assert envs.adaptive_lengths() == lengths


@pytest.mark.parametrize("raw", ["four", "-1", "1,,2", "4.0"])
def test_a_bad_value_names_the_variable_and_the_fix(monkeypatch, raw):
    monkeypatch.setenv("SPECDEC_ADAPTIVE_LENGTHS", raw)
    with pytest.raises(ValueError, match=r"SPECDEC_ADAPTIVE_LENGTHS=.*expected a comma list .*"
                                         r"unset it"):
        envs.adaptive_lengths()


def test_k_every_step_even_where_the_policy_would_draft_nothing(monkeypatch):
    controller = _controller(monkeypatch, str(K))
    reqs = [f"r{i}" for i in range(random.randint(1, 8))]
    for _ in range(40):
        k = controller.choose(reqs)
        assert k == K
        for req in reqs:  # every draft rejected
            controller.observe(req, k, 0)
    assert controller.probes == 0


def test_unset_the_same_costs_turn_drafting_off(monkeypatch):
    # The check above is not vacuous: with every length allowed the controller stops drafting.
    controller = _controller(monkeypatch, None)
    reqs = ["a", "b"]
    chosen = []
    for _ in range(40):
        k = controller.choose(reqs)
        chosen.append(k)
        for req in reqs:
            controller.observe(req, k, 0)
    assert chosen[-1] == 0 and chosen.count(K) < 5, chosen


def test_a_plain_step_or_k_never_drafts_in_between(monkeypatch):
    controller = _controller(monkeypatch, f"0,{K}")
    for _ in range(60):
        k = controller.choose(["a"])
        assert k in (0, K)
        controller.observe("a", k, k)  # every draft lands


def test_a_length_over_k_fails_where_the_engine_config_is_built(monkeypatch, smollm2_path):
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("SPECDEC_ADAPTIVE", "1")  # the test environment turns it off
    monkeypatch.setenv("SPECDEC_ADAPTIVE_LENGTHS", "0,5")
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    with pytest.raises(ValueError, match=r"SPECDEC_ADAPTIVE_LENGTHS=0,5: draft length 5 is over "
                                         r"num_speculative_tokens=3; give lengths from 0 to 3"):
        EngineArgs(model=smollm2_path, dtype="float32",
                   speculative_config=spec).create_engine_config()
