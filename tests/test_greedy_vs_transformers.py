"""Greedy output through our platform equals transformers' greedy output, token for token
(fp32, CPU), batched and one by one, with chunked prefill and with prefix caching on and off."""
from __future__ import annotations

import pytest

from tests.hf_reference import hf_greedy_token_ids, tokenize
from tests.prompts import LONG_PROMPT, PROMPTS

MAX_TOKENS = 32

pytestmark = pytest.mark.slow


def _params(max_tokens=MAX_TOKENS):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _generate(llm, token_id_prompts, max_tokens=MAX_TOKENS):
    from vllm.inputs import TokensPrompt

    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in token_id_prompts], _params(max_tokens))
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def prompt_ids(smollm2_path):
    return [tokenize(smollm2_path, p) for p in PROMPTS]


@pytest.fixture(scope="module")
def expected(smollm2_path, prompt_ids):
    return [hf_greedy_token_ids(smollm2_path, p, MAX_TOKENS) for p in prompt_ids]


def test_prompts_have_different_lengths(prompt_ids):
    assert len(prompt_ids) >= 8
    assert len({len(p) for p in prompt_ids}) >= 6


def test_batched_matches_transformers(engines, smollm2_path, prompt_ids, expected):
    llm = engines.get(smollm2_path, enable_prefix_caching=False)
    assert _generate(llm, prompt_ids) == expected


def test_one_by_one_matches_transformers(engines, smollm2_path, prompt_ids, expected):
    llm = engines.get(smollm2_path, enable_prefix_caching=False)
    for ids, want in zip(prompt_ids, expected):
        assert _generate(llm, [ids]) == [want]


def test_prefix_caching_matches_transformers(engines, smollm2_path, prompt_ids, expected):
    llm = engines.get(smollm2_path, enable_prefix_caching=True)
    assert _generate(llm, prompt_ids) == expected
    # Same prompts again: now their full blocks come from the prefix cache.
    assert _generate(llm, prompt_ids) == expected
    # A prompt sharing a long prefix with a cached one, and a different ending.
    shared = prompt_ids[7][:-3] + prompt_ids[0][-3:]
    assert _generate(llm, [shared]) == [hf_greedy_token_ids(smollm2_path, shared, MAX_TOKENS)]


def test_chunked_prefill_matches_transformers(engines, smollm2_path, prompt_ids, expected):
    # A 32-token step budget splits every long prompt into several prefill chunks, mixed with
    # the decodes of other requests in the same step.
    llm = engines.get(smollm2_path, enable_prefix_caching=False, enable_chunked_prefill=True,
                      max_num_batched_tokens=32, max_num_seqs=8)
    long_ids = tokenize(smollm2_path, LONG_PROMPT)
    assert len(long_ids) > 4 * 32
    got = _generate(llm, prompt_ids + [long_ids])
    assert got[:-1] == expected
    assert got[-1] == hf_greedy_token_ids(smollm2_path, long_ids, MAX_TOKENS)
