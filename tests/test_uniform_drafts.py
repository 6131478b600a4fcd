"""Uniform draft lengths for n-gram (host) and suffix (adaptive/uniform_drafts.py, opt-in).

In a real engine (SmolLM2, fp32, CPU) under a forced schedule of draft lengths: greedy output
equals plain decoding, every decode request of a speculative step verifies the step's length,
filler slots happen (prose prompts rarely match) and vLLM's draft counters count real drafts
only."""
from __future__ import annotations

import json

import pytest

from specdec_plugin.adaptive.uniform_drafts import padded_draft
from tests.environ import environ
from tests.engine_pool import counter_delta, counters
from tests.prompts import SPEC_PROMPTS
from tests.spec_configs import K, spec_config


def test_padded_draft_extends_to_k_and_never_shortens():
    assert padded_draft([5, 6], 4, 9) == [5, 6, 9, 9]
    assert padded_draft([], 3, 7) == [7, 7, 7]
    assert padded_draft([1, 2, 3], 2, 0) == [1, 2, 3]
    assert padded_draft([1, 2], 2, 0) == [1, 2]


PROMPTS = SPEC_PROMPTS[6:12]
MAX_TOKENS = 40




def _greedy(llm):
    from vllm import SamplingParams

    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                                ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_padded_steps_are_uniform_lossless_and_counted_as_real_drafts(engines, smollm2_path,
                                                                      method, tmp_path):
    baseline = _greedy(engines.get(smollm2_path, enable_prefix_caching=False))
    log = tmp_path / "schedule.jsonl"
    # The engine process reads both when it starts: set around its construction and use.
    with environ(SPECDEC_UNIFORM_DRAFTS="1", SPECDEC_TEST_SCHEDULE_LOG=str(log)):
        llm = engines.get(smollm2_path, metrics=True, enable_prefix_caching=False,
                          disable_log_stats=False, speculative_config=spec_config(method, ""),
                          scheduler_cls="tests.forced_draft_lengths.ForcedUniformDraftScheduler")
        before = counters(llm)
        got = _greedy(llm)
        after = counters(llm)
    assert got == baseline

    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert steps, "no speculative step was scheduled"
    real = filler = 0
    for step in steps:
        # Every decoding request verifies the same number of drafts, including those whose
        # proposer found nothing (1 scheduled token without padding). Prompts are longer than
        # 1+K tokens, so a request scheduled at most 1+K tokens is decoding.
        lengths = set(step["spec_lens"].values())
        assert len(lengths) == 1, step
        decoding = {r: n for r, n in step["tokens"].items() if n <= 1 + K}
        assert set(decoding.values()) == {1 + lengths.pop()}, step
        for req_id, n in step["spec_lens"].items():
            slots = step["filler"].get(req_id, 0)
            assert 0 <= slots <= n
            real += n - slots
            filler += slots
    assert filler > 0, "no filler slot: the test does not exercise padding"
    drafted = counter_delta(before, after, "vllm:spec_decode_num_draft_tokens")
    accepted = counter_delta(before, after, "vllm:spec_decode_num_accepted_tokens")
    assert drafted == real, (drafted, real, filler)
    assert accepted <= drafted
