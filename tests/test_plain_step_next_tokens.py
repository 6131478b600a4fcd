"""A plain decode step's next tokens without vLLM's per-request loop
(spec_decode/plain_step_next_tokens.py) equal what vLLM's kernel computes (our torch reference
of it, tests/ops/test_spec_prep.py checks the reference against the kernels), on fresh random
batches; every other step falls through to vLLM's function."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from specdec_plugin.ops.spec_prep import reference as ref
from specdec_plugin.spec_decode.plain_step_next_tokens import (
    PlainStepNextTokens,
    plain_step_next_tokens,
)


def _random_plain_step(g: torch.Generator, vocab: int = 49152):
    num_reqs = int(torch.randint(1, 257, (1,), generator=g))
    # vLLM's sampler gives int32 ids (the copy must still be made) or int64 (a cast).
    dtype = (torch.int32, torch.int64)[int(torch.randint(0, 2, (1,), generator=g))]
    sampled = torch.randint(0, vocab, (num_reqs, 1), generator=g, dtype=dtype)
    return num_reqs, sampled, vocab


def _kernel(sampled, discard, num_reqs, vocab, g):
    backup = torch.randint(0, vocab, (num_reqs,), generator=g, dtype=torch.int32)
    nxt = torch.full((num_reqs,), -7, dtype=torch.int32)
    cnt = torch.full((num_reqs,), -7, dtype=torch.int32)
    ref.eagle_prepare_next_token_padded(sampled, torch.as_tensor(discard), backup, nxt, cnt,
                                        vocab, sampled.shape[1], num_reqs)
    return nxt, cnt


def test_plain_steps_match_the_kernel_on_random_batches():
    g = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    for _ in range(20):
        num_reqs, sampled, vocab = _random_plain_step(g)
        discard = np.zeros(num_reqs + 3, dtype=bool)  # the runner's buffer is longer
        discard[num_reqs:] = True  # rows past the batch are not read
        got = plain_step_next_tokens(sampled, num_reqs, discard)
        assert got is not None
        want = _kernel(sampled, discard[:num_reqs], num_reqs, vocab, g)
        for have, expect in zip(got, want):
            assert have.dtype == torch.int32 and torch.equal(have, expect)
        # A fresh tensor, not a view of the sampled ids (vLLM keeps it as the next inputs).
        assert got[0].data_ptr() != sampled.data_ptr()


def test_other_steps_fall_through():
    g = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    num_reqs, sampled, _ = _random_plain_step(g)
    plain = np.zeros(num_reqs, dtype=bool)
    discarded = plain.copy()
    discarded[int(torch.randint(0, num_reqs, (1,), generator=g))] = True
    assert plain_step_next_tokens(sampled, num_reqs, discarded) is None  # a chunked prefill
    assert plain_step_next_tokens(sampled.repeat(1, 3), num_reqs, plain) is None  # drafts verified
    assert plain_step_next_tokens(sampled, num_reqs + 1, np.zeros(num_reqs + 1, bool)) is None
    assert plain_step_next_tokens(sampled, num_reqs, None) is None  # no host mask


class _VllmProposer:
    def __init__(self, *args, **kwargs):
        self.calls = 0

    def prepare_next_token_ids_padded(self, sampled, requests, batch, mask):
        self.calls += 1
        return "vllm"


class _Proposer(PlainStepNextTokens, _VllmProposer):
    pass


def test_the_mixin_reads_the_runners_host_mask():
    sampled = torch.tensor([[5], [9]])
    runner = SimpleNamespace(discard_request_mask=SimpleNamespace(np=np.zeros(4, dtype=bool)))
    proposer = _Proposer(runner=runner)
    batch = SimpleNamespace(num_reqs=2)
    nxt, cnt = proposer.prepare_next_token_ids_padded(sampled, {}, batch, None)
    assert nxt.tolist() == [5, 9] and cnt.tolist() == [1, 1] and proposer.calls == 0
    runner.discard_request_mask.np[1] = True
    assert proposer.prepare_next_token_ids_padded(sampled, {}, batch, None) == "vllm"
    assert _Proposer().prepare_next_token_ids_padded(sampled, {}, batch, None) == "vllm"
