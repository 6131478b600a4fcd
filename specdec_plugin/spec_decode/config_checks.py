"""Checks of the user's ``speculative_config``, run before vLLM builds any config and before
any model loads (patch P6 calls ``validate_speculative_config``). vLLM validates much of this
too, later and in its own words; ours names the field and says how to fix it.

Each method has one checker in ``METHOD_CHECKS``; the shared checks run for every method.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable

from specdec_plugin.config_checks import SpecDecConfigError

# vLLM's MTP aliases are all served by the same MTP path.
MTP_ALIASES = {"mtp", "deepseek_mtp", "mimo_mtp", "qwen3_next_mtp"}


def _read_config(path: str | None) -> dict | None:
    if not path:
        return None
    config = os.path.join(os.path.expanduser(path), "config.json")
    if not os.path.isfile(config):
        return None  # a hub id or a missing path: the path check reports the latter
    with open(config) as f:
        return json.load(f)


def _text_config(config: dict) -> dict:
    return config.get("text_config", config)


def _need_draft_model(spec: dict, method: str) -> None:
    if not spec.get("model"):
        raise SpecDecConfigError(
            f"speculative_config.model is required for method={method!r}. Fix: set it to the "
            f"directory of the {method} checkpoint."
        )


def _check_draft_model(spec: dict, target: dict | None) -> None:
    _need_draft_model(spec, "draft_model")
    draft = _read_config(spec["model"])
    if target and draft:
        t, d = _text_config(target).get("vocab_size"), _text_config(draft).get("vocab_size")
        if t != d:
            raise SpecDecConfigError(
                f"speculative_config.model={spec['model']!r} has vocab_size={d} but the target has "
                f"vocab_size={t}: a draft model must share the target's tokenizer. Fix: use a draft "
                f"model trained with the target's tokenizer."
            )


def _check_eagle(spec: dict, target: dict | None) -> None:
    _need_draft_model(spec, spec["method"])
    draft = _read_config(spec["model"])
    if target and draft:
        t = _text_config(target).get("hidden_size")
        d = _text_config(draft).get("target_hidden_size") or _text_config(draft).get("hidden_size")
        if t != d:
            raise SpecDecConfigError(
                f"speculative_config.model={spec['model']!r} is an {spec['method']} head for hidden "
                f"size {d}, but the target's hidden_size is {t}. Fix: use a head trained for this "
                f"target model."
            )


def _check_mtp(spec: dict, target: dict | None) -> None:
    layers = _text_config(target or {}).get("num_nextn_predict_layers", 0)
    if target is not None and not layers:
        raise SpecDecConfigError(
            f"speculative_config.method={spec['method']!r} needs a target with built-in "
            f"multi-token-prediction layers (num_nextn_predict_layers > 0 in config.json), and "
            f"this model has none. Fix: serve an MTP checkpoint, or pick another method "
            f"(ngram, suffix, draft_model, eagle, eagle3)."
        )


def _check_suffix(spec: dict, target: dict | None) -> None:
    ranges = {
        "suffix_decoding_max_tree_depth": (1, None, "an integer >= 1 (default 24)"),
        "suffix_decoding_max_cached_requests": (0, None, "an integer >= 0 (default 10000; 0 disables the cache)"),
        "suffix_decoding_max_spec_factor": (0, None, "a number >= 0 (default 1.0)"),
        "suffix_decoding_min_token_prob": (0, 1, "a number in [0, 1] (default 0.1)"),
    }
    for field, (low, high, hint) in ranges.items():
        if field not in spec:
            continue
        value = spec[field]
        if not isinstance(value, (int, float)) or value < low or (high is not None and value > high):
            raise SpecDecConfigError(f"speculative_config.{field}={value!r} is out of range. Fix: use {hint}.")


def _check_ngram(spec: dict, target: dict | None) -> None:
    low, high = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
    for field, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise SpecDecConfigError(f"speculative_config.{field}={value!r} must be an integer >= 1. Fix: e.g. {field}=3.")
    if low is not None and high is not None and low > high:
        raise SpecDecConfigError(
            f"speculative_config.prompt_lookup_min={low} > prompt_lookup_max={high}. Fix: make min <= max."
        )


METHOD_CHECKS: dict[str, Callable[[dict, dict | None], None]] = {
    "ngram": _check_ngram,
    "ngram_gpu": _check_ngram,  # vLLM's name for the device path; the device layer decides
    "suffix": _check_suffix,
    "draft_model": _check_draft_model,
    "eagle": _check_eagle,
    "eagle3": _check_eagle,
    **{alias: _check_mtp for alias in MTP_ALIASES},
}


# vLLM's other spelling of method "ngram": a "model" named after it, with no method given.
NGRAM_MODEL_NAMES = ("ngram", "[ngram]")


def speculative_method(spec: dict) -> str | None:
    """The method a user's speculative config asks for (None: vLLM infers it from the model)."""
    method = spec.get("method")
    if method is None and spec.get("model") in NGRAM_MODEL_NAMES:
        return "ngram"
    return method


def validate_speculative_config(spec: Any, target_path: str | None) -> None:
    if spec is None or not isinstance(spec, dict):
        return  # an already-built SpeculativeConfig was validated by vLLM
    method = speculative_method(spec)
    if method is None:
        return  # vLLM infers it from the draft model; the inferred one is checked by vLLM
    if method not in METHOD_CHECKS:
        raise SpecDecConfigError(
            f"speculative_config.method={method!r} is not a method specdec_plugin runs. Fix: use "
            f"one of {', '.join(sorted(METHOD_CHECKS))}."
        )
    k = spec.get("num_speculative_tokens")
    if k is not None and (not isinstance(k, int) or k < 1):
        raise SpecDecConfigError(
            f"speculative_config.num_speculative_tokens={k!r} must be a positive integer. Fix: "
            f"set it to the number of tokens to draft per step, e.g. 3."
        )
    METHOD_CHECKS[method](spec, _read_config(target_path))
