"""The rejection sampler's greedy path (``_greedy_forward``): when every request is greedy and
nothing edits the logits, the step's tokens come from one argmax over the raw logits. On random
batches (fresh each run) it must give exactly what the general path gives, synthetic acceptance
included; ``argmax_decides`` must send every batch that something could change to the general
path."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from specdec_plugin.spec_decode import rejection_sampler as rs


def _metadata(rng: random.Random, vocab: int, k: int):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    n_req = rng.randrange(1, 9)
    drafts = [[rng.randrange(vocab) for _ in range(rng.randrange(0, k + 1))] for _ in range(n_req)]
    meta = SpecDecodeMetadata.make_dummy(drafts, torch.device("cpu"))
    num_sampled = [len(d) + 1 for d in drafts]
    bonus_idx = torch.tensor(num_sampled).cumsum(0) - 1
    meta.bonus_logits_indices = bonus_idx
    meta.target_logits_indices = torch.tensor(
        [i for r, d in enumerate(drafts) for i in range(int(bonus_idx[r]) - len(d), int(bonus_idx[r]))],
        dtype=torch.long)
    sm = SamplingMetadata(
        temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None,
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(n_req), presence_penalties=torch.zeros(n_req),
        repetition_penalties=torch.ones(n_req), output_token_ids=[[] for _ in range(n_req)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    logits = torch.randn(sum(num_sampled), vocab) * 3
    # Make some drafts the target's argmax, so that acceptance runs are not all empty.
    for i, row in enumerate(meta.target_logits_indices.tolist()):
        if rng.random() < 0.6:
            logits[row, int(meta.draft_token_ids[i])] = logits[row].max() + 1
    return meta, logits, sm


def _both_paths(sampler, meta, logits, sm, monkeypatch, seed):
    torch.manual_seed(seed)
    fast = sampler(meta, None, logits.clone(), sm)
    with monkeypatch.context() as m:
        m.setattr(rs, "argmax_decides", lambda _: False)
        torch.manual_seed(seed)
        general = sampler(meta, None, logits.clone(), sm)
    return fast, general


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_path_equals_general_path(monkeypatch, dtype):
    from vllm.v1.sample.sampler import Sampler

    rng = random.Random()
    sampler = rs.SpecDecRejectionSampler(Sampler())
    calls = []
    monkeypatch.setattr(sampler, "_greedy_forward",
                        lambda *a, _f=sampler._greedy_forward: calls.append(1) or _f(*a))
    for _ in range(5):
        k = rng.randrange(1, 6)
        meta, logits, sm = _metadata(rng, vocab=rng.randrange(50, 400), k=k)
        fast, general = _both_paths(sampler, meta, logits.to(dtype), sm, monkeypatch, rng.randrange(1 << 30))
        assert fast.sampled_token_ids.dtype == general.sampled_token_ids.dtype == torch.int32
        assert torch.equal(fast.sampled_token_ids, general.sampled_token_ids)
        assert fast.logprobs_tensors is None and general.logprobs_tensors is None
    assert len(calls) == 5  # the greedy path ran for each batch, the general one when forced


def test_greedy_path_with_synthetic_acceptance(monkeypatch):
    from vllm.v1.sample.sampler import Sampler

    rng = random.Random()
    sampler = rs.SpecDecRejectionSampler(Sampler())
    k = 4
    sampler.synthetic_conditional_rates = torch.rand(k)
    for _ in range(4):
        meta, logits, sm = _metadata(rng, vocab=rng.randrange(50, 400), k=k)
        fast, general = _both_paths(sampler, meta, logits, sm, monkeypatch, rng.randrange(1 << 30))
        assert torch.equal(fast.sampled_token_ids, general.sampled_token_ids)


def _greedy_sm(**changes):
    from vllm.v1.sample.logits_processor import LogitsProcessors

    base = dict(all_greedy=True, max_num_logprobs=None, logprob_token_ids=None, no_penalties=True,
                bad_words_token_ids={}, allowed_token_ids_mask=None,
                thinking_budget_state_holder=None, logitsprocs=LogitsProcessors())
    return SimpleNamespace(**{**base, **changes})


def _processor(cls, **state):
    processor = object.__new__(cls)  # the real class, without an engine config to build it
    for name, value in state.items():
        setattr(processor, name, value)
    return processor


def test_argmax_decides_only_when_nothing_edits_the_logits():
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinTokensLogitsProcessor,
    )

    assert rs.argmax_decides(_greedy_sm())
    idle = LogitsProcessors([_processor(LogitBiasLogitsProcessor, biases={}),
                             _processor(MinTokensLogitsProcessor, min_toks={})])
    assert idle.non_argmax_invariant and rs.argmax_decides(_greedy_sm(logitsprocs=idle))
    tracked = SimpleNamespace(has_tracked_requests=lambda: True)
    untracked = SimpleNamespace(has_tracked_requests=lambda: False)
    assert rs.argmax_decides(_greedy_sm(thinking_budget_state_holder=untracked))
    for changes in (
        {"all_greedy": False},
        {"max_num_logprobs": random.choice([0, 3, -1])},
        {"logprob_token_ids": {0: [1, 2]}},
        {"no_penalties": False},
        {"bad_words_token_ids": {0: [[5]]}},
        {"allowed_token_ids_mask": torch.zeros(1, 8, dtype=torch.bool)},
        {"thinking_budget_state_holder": tracked},
        {"logitsprocs": LogitsProcessors([_processor(LogitBiasLogitsProcessor, biases={0: {3: 1.0}})])},
        {"logitsprocs": LogitsProcessors([_processor(MinTokensLogitsProcessor, min_toks={0: (4, [], {2})})])},
        # A processor we do not know may change any argmax.
        {"logitsprocs": SimpleNamespace(non_argmax_invariant=[object()])},
    ):
        assert not rs.argmax_decides(_greedy_sm(**changes)), changes
