"""Statistical and end-to-end checks of the rejection sampler built on our kernels.

- Speculative sampling must be lossless: whatever the drafter proposes (with its probabilities,
  or none at all, ngram-style), every emitted token is distributed as the target p after
  temperature / top-k / top-p. Checked on the first token and on the second given the first
  draft was accepted, over tens of thousands of requests run as one batch, with the total
  variation distance shrinking as 1/sqrt(N).
- Greedy requests emit the target argmax and stop at the first mismatch; K accepted drafts give
  K + 1 tokens.
- ``SpecDecRejectionSampler`` gives exactly what vLLM's own ``RejectionSampler`` gives running
  vLLM's own Triton kernels (compiled from its source; interpreted on CPU), same seed, logprobs
  included.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specdec_plugin.spec_decode import rejection_sampler as rs

VOCAB, K = 24, 3
TEMPERATURE, TOP_K, TOP_P = 0.8, 14, 0.9
SMALL_N = 5_000


def sampling(batch, greedy_rows=None, top=True):
    temp = torch.full((batch,), TEMPERATURE)
    if greedy_rows is not None:
        temp[greedy_rows] = 0.0
    all_greedy = bool((temp == 0).all())
    return SimpleNamespace(
        temperature=None if all_greedy else temp, all_greedy=all_greedy,
        all_random=bool((temp != 0).all()),
        top_k=torch.full((batch,), TOP_K, dtype=torch.int32) if top else None,
        top_p=torch.full((batch,), TOP_P) if top else None, generators={},
    )


def target_distribution(logits_row):
    """p after temperature, top-k and top-p, computed independently of the sampler."""
    z = logits_row / TEMPERATURE
    keep = torch.zeros(VOCAB, dtype=torch.bool)
    keep[z.topk(TOP_K).indices] = True
    z = z.masked_fill(~keep, float("-inf"))
    p = z.softmax(-1)
    order = p.argsort(descending=True)
    mass_before = p[order].cumsum(0) - p[order]
    nucleus = torch.zeros(VOCAB, dtype=torch.bool)
    nucleus[order[mass_before < TOP_P]] = True  # smallest prefix with mass >= top_p
    p = p * nucleus
    return p / p.sum()


def run_spec_step(n, with_draft_probs, seed):
    """n identical requests with K drafts each, drafts sampled from a drafter q != p."""
    g = torch.Generator().manual_seed(100)
    target_logits = torch.randn(K, VOCAB, generator=g) * 1.5
    # A plausible drafter: close to the target but not equal (else everything is accepted).
    draft_dist = (target_logits / TEMPERATURE + torch.randn(K, VOCAB, generator=g)).softmax(-1)
    torch.manual_seed(seed)
    draft = torch.multinomial(draft_dist, n, replacement=True).T.contiguous()  # [n, K]
    cu = torch.arange(1, n + 1, dtype=torch.int32) * K
    meta = sampling(n)
    logits = target_logits.repeat(n, 1)
    logits = rs.apply_sampling_constraints(logits, cu, meta)
    draft_probs = draft_dist.repeat(n, 1) if with_draft_probs else None
    bonus = torch.full((n, 1), VOCAB - 1, dtype=torch.int32)
    out = rs.rejection_sample(draft.view(-1).to(torch.int32), [K] * n, K, cu, draft_probs,
                              logits, bonus, meta)
    expected = torch.stack([target_distribution(target_logits[k]) for k in range(K)])
    return out, draft, expected


def tv(samples, p):
    counts = torch.bincount(samples.long(), minlength=VOCAB).double()
    return 0.5 * (counts / counts.sum() - p.double()).abs().sum().item()


@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_first_token_follows_target(with_draft_probs):
    # TV of an unbiased sampler falls like 1/sqrt(N); N -> 16N makes "it fell" robust to noise.
    tvs = {}
    for n in (SMALL_N, 16 * SMALL_N):
        out, _, p = run_spec_step(n, with_draft_probs, seed=n)
        assert (out[:, 0] >= 0).all()
        tvs[n] = tv(out[:, 0], p[0])
    assert tvs[16 * SMALL_N] < tvs[SMALL_N], tvs
    for n, value in tvs.items():
        assert value < 3 / n**0.5, tvs


@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_second_token_given_first_accepted(with_draft_probs):
    tvs = {}
    for n in (SMALL_N, 16 * SMALL_N):
        out, draft, p = run_spec_step(n, with_draft_probs, seed=7 * n)
        accepted_first = out[:, 0] == draft[:, 0]  # x1 accepted -> position 2 was sampled
        second = out[accepted_first, 1]
        assert (second >= 0).all() and second.numel() > n // 20
        tvs[n] = (tv(second, p[1]), second.numel())
    (tv_small, m_small), (tv_large, m_large) = tvs[SMALL_N], tvs[16 * SMALL_N]
    assert tv_large < tv_small
    assert tv_large < 3 / m_large**0.5 and tv_small < 3 / m_small**0.5, tvs


def test_acceptance_is_not_trivial():
    """Drafter != target: some but not all drafts get accepted, and rows are well formed."""
    out, draft, _ = run_spec_step(4000, True, seed=1)
    accepted = (out[:, :K] == draft).cumprod(1).sum(1)
    assert 0 < accepted.float().mean() < K
    emitted = (out != -1).sum(1)
    assert torch.equal(emitted, torch.clamp(accepted + 1, max=K + 1))
    # -1 only after the emitted prefix
    assert all((row[e:] == -1).all() for row, e in zip(out, emitted))


def test_greedy_rows_emit_argmax_and_stop_at_first_mismatch():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4 * K, VOCAB, generator=g)
    argmax = logits.argmax(-1).view(4, K)
    draft = argmax.clone()
    draft[1, 1] = (argmax[1, 1] + 1) % VOCAB  # mismatch at position 1
    draft[2, 0] = (argmax[2, 0] + 1) % VOCAB  # mismatch at position 0
    draft[3, 2] = -1  # padded draft at the last position
    bonus = torch.tensor([[5], [6], [7], [8]], dtype=torch.int32)
    cu = torch.tensor([K, 2 * K, 3 * K, 4 * K], dtype=torch.int32)
    mixed_path = sampling(4, greedy_rows=slice(None))
    # Same rows through the per-row `is_greedy` path (batch not flagged all-greedy).
    mixed_path.all_greedy, mixed_path.temperature = False, torch.zeros(4)
    for meta in (sampling(4, greedy_rows=slice(None)), mixed_path):
        out = rs.rejection_sample(draft.view(-1).to(torch.int32), [K] * 4, K, cu, None,
                                  rs.apply_sampling_constraints(logits.clone(), cu, meta),
                                  bonus, meta)
        a = argmax.tolist()
        assert out[0].tolist() == [*a[0], 5]  # all accepted: K + 1 tokens
        assert out[1].tolist() == [a[1][0], a[1][1], -1, -1]
        assert out[2].tolist() == [a[2][0], -1, -1, -1]
        assert out[3].tolist() == [a[3][0], a[3][1], a[3][2], -1]


def test_mixed_batch_keeps_greedy_rows_exact():
    g = torch.Generator().manual_seed(4)
    n = 64
    logits = torch.randn(n * K, VOCAB, generator=g)
    draft = logits.argmax(-1).to(torch.int32)
    cu = torch.arange(1, n + 1, dtype=torch.int32) * K
    greedy = torch.arange(n) % 2 == 0
    meta = sampling(n, greedy_rows=greedy)
    bonus = torch.full((n, 1), 3, dtype=torch.int32)
    torch.manual_seed(0)
    out = rs.rejection_sample(draft, [K] * n, K, cu, None,
                              rs.apply_sampling_constraints(logits.clone(), cu, meta), bonus, meta)
    assert (out[greedy] == torch.cat([draft.view(n, K), bonus], 1)[greedy]).all()
    assert (out[~greedy, 0] >= 0).all()


def _vllm_inputs(n_req=5, seed=0):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    g = torch.Generator().manual_seed(seed)
    drafts = [torch.randint(0, VOCAB, (int(k),), generator=g).tolist()
              for k in torch.randint(0, K + 1, (n_req,), generator=g)]
    drafts[0] = [1] * K
    meta = SpecDecodeMetadata.make_dummy(drafts, torch.device("cpu"))
    num_sampled = [len(d) + 1 for d in drafts]
    bonus_idx = torch.tensor(num_sampled).cumsum(0) - 1
    target_idx = torch.tensor([i for r, d in enumerate(drafts)
                               for i in range(int(bonus_idx[r]) - len(d), int(bonus_idx[r]))])
    meta.bonus_logits_indices, meta.target_logits_indices = bonus_idx, target_idx
    temp = torch.tensor([0.0, 0.7, 1.0, 0.0, 1.3][:n_req])
    sm = SamplingMetadata(
        temperature=temp, all_greedy=False, all_random=False, top_p=torch.full((n_req,), 0.95),
        top_k=torch.full((n_req,), 10, dtype=torch.int32), generators={}, max_num_logprobs=2,
        no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.zeros(n_req),
        presence_penalties=torch.zeros(n_req), repetition_penalties=torch.ones(n_req),
        output_token_ids=[[] for _ in range(n_req)], allowed_token_ids_mask=None,
        bad_words_token_ids={}, logitsprocs=LogitsProcessors(),
    )
    logits = torch.randn(sum(num_sampled), VOCAB, generator=g) * 2
    return meta, logits, sm


def test_matches_vllm_rejection_sampler(monkeypatch):
    import vllm.v1.sample.rejection_sampler as vrs
    from vllm.v1.sample.sampler import Sampler

    from tests.vllm_kernels import load_vllm_kernels

    # vLLM replaces its kernels by a placeholder when Triton has no driver (CPU): install the
    # real ones, compiled from vLLM's source, so "theirs" is vLLM's sampler end to end.
    symbols = ["rejection_greedy_sample_kernel", "rejection_random_sample_kernel",
               "expand_kernel", "sample_recovered_tokens_kernel"]
    real = load_vllm_kernels("v1/sample/rejection_sampler.py", symbols)
    for symbol in symbols:
        monkeypatch.setattr(vrs, symbol, getattr(real, symbol))
    meta, logits, sm = _vllm_inputs()
    ours = rs.SpecDecRejectionSampler(Sampler())
    theirs = vrs.RejectionSampler(Sampler())
    for draft_probs in (None, torch.rand(meta.draft_token_ids.shape[0], VOCAB).softmax(-1)):
        torch.manual_seed(11)
        a = ours(meta, draft_probs, logits.clone(), sm)
        torch.manual_seed(11)
        b = theirs(meta, draft_probs, logits.clone(), sm)
        assert a.sampled_token_ids.dtype == torch.int32
        assert a.sampled_token_ids.shape == (5, meta.max_spec_len + 1)
        assert torch.equal(a.sampled_token_ids, b.sampled_token_ids)
        for x, y in zip(a.logprobs_tensors, b.logprobs_tensors):
            torch.testing.assert_close(x, y)
        tokens, _ = vrs.RejectionSampler.parse_output(a.sampled_token_ids, VOCAB)
        assert len(tokens[0]) >= 1 and all(1 <= len(t) <= K + 1 for t in tokens)
