"""Bad speculative configurations fail before any model loads, naming the field and the fix."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_llama() -> str:
    from specdec_plugin.models import tiny_checkpoint

    return str(tiny_checkpoint("llama"))  # vocab 1000, hidden 64: wrong for SmolLM2


def _build(target: str, spec: dict):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=target, dtype="float32", speculative_config=spec).create_engine_config()


CASES = {
    "unknown method": ({"method": "medusa2", "num_speculative_tokens": 3},
                       r"speculative_config.method='medusa2' is not a method .* Fix: use one of .*ngram"),
    "K = 0": ({"method": "ngram", "num_speculative_tokens": 0},
              r"num_speculative_tokens=0 must be a positive integer. Fix:"),
    "K < 0": ({"method": "suffix", "num_speculative_tokens": -2},
              r"num_speculative_tokens=-2 must be a positive integer. Fix:"),
    "mtp without MTP layers": ({"method": "mtp", "num_speculative_tokens": 1},
                               r"method='mtp' needs a target with built-in multi-token-prediction .* Fix:"),
    "suffix depth": ({"method": "suffix", "num_speculative_tokens": 3, "suffix_decoding_max_tree_depth": 0},
                     r"suffix_decoding_max_tree_depth=0 is out of range. Fix: use an integer >= 1"),
    "suffix min prob": ({"method": "suffix", "num_speculative_tokens": 3, "suffix_decoding_min_token_prob": 1.5},
                        r"suffix_decoding_min_token_prob=1.5 is out of range. Fix: use a number in \[0, 1\]"),
    "suffix spec factor": ({"method": "suffix", "num_speculative_tokens": 3, "suffix_decoding_max_spec_factor": -1},
                           r"suffix_decoding_max_spec_factor=-1 is out of range"),
    "ngram min > max": ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
                        r"prompt_lookup_min=4 > prompt_lookup_max=2. Fix"),
    "draft model without path": ({"method": "draft_model", "num_speculative_tokens": 3},
                                 r"speculative_config.model is required for method='draft_model'. Fix"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_speculative_config(smollm2_path, case):
    spec, message = CASES[case]
    with pytest.raises(ValueError, match=message):
        _build(smollm2_path, spec)


def test_draft_model_with_another_vocabulary(smollm2_path, tiny_llama):
    spec = {"method": "draft_model", "model": tiny_llama, "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match=r"vocab_size=1000 but the target has vocab_size=49152.*Fix"):
        _build(smollm2_path, spec)


def test_eagle_head_with_wrong_hidden_size(smollm2_path, tiny_llama):
    spec = {"method": "eagle", "model": tiny_llama, "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match=r"eagle head for hidden size 64, but the target's hidden_size is 576.*Fix"):
        _build(smollm2_path, spec)


def test_missing_draft_path(smollm2_path, tmp_path):
    spec = {"method": "eagle3", "model": str(tmp_path / "gone"), "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match=r"speculative_config.model='.*gone': no such file or directory. Fix"):
        _build(smollm2_path, spec)


def test_good_configs_pass_our_checks(smollm2_path):
    from specdec_plugin.spec_decode.config_checks import validate_speculative_config

    for spec in ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
                 {"model": "[ngram]", "num_speculative_tokens": 2},
                 {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_min_token_prob": 0.2},
                 {"method": "draft_model", "model": smollm2_path, "num_speculative_tokens": 3}):
        validate_speculative_config(spec, smollm2_path)
