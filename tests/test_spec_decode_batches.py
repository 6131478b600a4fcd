"""Speculative decoding in realistic batches: mixed sampling settings, length limits hit in the
middle of a speculation step, preemption under a small KV cache, and the acceptance metrics."""
from __future__ import annotations

import pytest

from tests.engine_pool import counter_delta, counters
from tests.prompts import SPEC_PROMPTS
from tests.spec_configs import spec_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def baseline_llm(engines, smollm2_path):
    return engines.get(smollm2_path, enable_prefix_caching=False)


def _greedy_ids(llm, prompts, max_tokens):
    from vllm import SamplingParams

    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def long_spec_llm(engines, smollm2_path):
    # K = 10, a short context, and a KV cache of about 600 tokens: long requests run into
    # max_model_len mid-speculation and, together, do not fit and get preempted.
    spec = {"method": "ngram", "num_speculative_tokens": 10, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    return engines.get(smollm2_path, metrics=True, enable_prefix_caching=False, disable_log_stats=False,
                       max_model_len=256, kv_cache_memory_bytes=28 * 1024 * 1024,
                       max_num_seqs=8, speculative_config=spec)


def test_length_limit_mid_speculation(long_spec_llm):
    from vllm import SamplingParams

    # Repetitive text keeps the n-gram drafter proposing long drafts up to the limit.
    prompt = "1 2 3 4 5 6 7 8 9 10 " * 8
    outs = long_spec_llm.generate([prompt] * 2, SamplingParams(temperature=0.0, max_tokens=1000))
    for out in outs:
        assert out.outputs[0].finish_reason == "length"
        assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 256


PREEMPTION_TOKENS = 96


def test_preemption_loses_nothing(long_spec_llm, baseline_llm):
    prompts = SPEC_PROMPTS[:8]  # 119 prompt tokens
    # 96 tokens each (150 until CI ran over 45 minutes): 8 * 96 + 119 tokens, and 10 draft
    # slots per request, against a cache of about 600: the requests fill it about halfway
    # through their answers and are preempted and recomputed with drafts in flight after that.
    before = counters(long_spec_llm)
    got = _greedy_ids(long_spec_llm, prompts, PREEMPTION_TOKENS)
    preempted = counter_delta(before, counters(long_spec_llm), "vllm:num_preemptions")
    print(f"{preempted} preemptions")
    assert preempted > 0, "the KV cache was big enough: this test did not preempt anything"
    assert got == _greedy_ids(baseline_llm, prompts, PREEMPTION_TOKENS)


# The n-gram engine's tests last, mixed batch first: the metrics test then reads counters of
# the newest engine (tests/engine_pool.py) without a rebuild, and so does
# test_spec_decode_greedy.py's n-gram case, which runs next in a full session.
def test_mixed_batch_with_speculation(engines, smollm2_path, baseline_llm):
    """Greedy, temperature, top-p/top-k, penalties, logprobs, stop strings and n>1 in one batch:
    nothing crashes, every request is answered as asked, greedy requests still match."""
    from vllm import SamplingParams

    llm = engines.get(smollm2_path, enable_prefix_caching=False, disable_log_stats=False,
                      speculative_config=spec_config("ngram", smollm2_path))
    prompts = SPEC_PROMPTS[:7]
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=1, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=2, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0.7, repetition_penalty=1.3, presence_penalty=0.5,
                       frequency_penalty=0.5, seed=3, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0.0, logprobs=3, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.0, stop=["\n"], max_tokens=60),
        SamplingParams(temperature=0.9, n=3, seed=4, max_tokens=24, ignore_eos=True),
    ]
    outs = llm.generate(prompts, params)
    greedy_ref = _greedy_ids(baseline_llm, [prompts[0], prompts[4]], 40)

    assert list(outs[0].outputs[0].token_ids) == greedy_ref[0]
    assert list(outs[4].outputs[0].token_ids) == greedy_ref[1][:20]
    for out in (outs[1], outs[2], outs[3]):
        assert len(out.outputs[0].token_ids) == 40
    logprobs = outs[4].outputs[0].logprobs
    assert len(logprobs) == 20 and all(len(step) >= 3 for step in logprobs)
    # Each position's chosen token carries its logprob, and that is the top one under greedy.
    for token, step in zip(outs[4].outputs[0].token_ids, logprobs):
        assert token in step and step[token].rank == 1
    stopped = outs[5].outputs[0]
    assert "\n" not in stopped.text and stopped.finish_reason in ("stop", "length")
    assert len(outs[6].outputs) == 3 and all(len(c.token_ids) == 24 for c in outs[6].outputs)


def test_acceptance_metrics_are_consistent(engines, smollm2_path):
    # The n-gram drafter keeps no state across requests, so this leaves the shared engine as
    # it found it (the suffix drafter's global cache would remember these outputs).
    llm = engines.get(smollm2_path, metrics=True, enable_prefix_caching=False, disable_log_stats=False,
                      speculative_config=spec_config("ngram", smollm2_path))
    from vllm import SamplingParams

    before = counters(llm)
    llm.generate(SPEC_PROMPTS[8:12], SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True))
    after = counters(llm)

    def delta(name):
        return counter_delta(before, after, name)

    drafts, draft_tokens = delta("vllm:spec_decode_num_drafts"), delta("vllm:spec_decode_num_draft_tokens")
    accepted, per_pos = delta("vllm:spec_decode_num_accepted_tokens"), delta("vllm:spec_decode_num_accepted_tokens_per_pos")
    assert drafts > 0 and 0 < accepted <= draft_tokens
    assert sum(per_pos) == accepted
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:])), "position k+1 accepted more often than k"
