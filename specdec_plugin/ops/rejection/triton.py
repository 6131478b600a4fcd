"""Triton rejection-sampling kernels; same signatures and results as ``reference.py``.

One program per request for the accept/reject kernels: all draft positions of the request are
handled as one vector (``max_spec_len`` <= 128), the first rejection found with a min-reduction,
so there is no serial loop. Recovered tokens use one program per draft token, streaming the
vocabulary in tiles and keeping the running best score.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_plugin.ops.rejection.reference import _request_of_token
from specdec_plugin.ops.rejection.validate import (
    check_expand_batch_to_tokens,
    check_rejection_greedy_sample,
    check_rejection_random_sample,
    check_sample_recovered_tokens,
)


@triton.jit
def _request_span(cu_ptr, req):
    end = tl.load(cu_ptr + req).to(tl.int64)
    start = tl.load(cu_ptr + req - 1, mask=req > 0, other=0).to(tl.int64)
    return start, end - start


@triton.jit
def _store_prefix_and_bonus(
    out_row_ptr, pos, valid, accepted, emitted, num_drafts, bonus_ptr, req,
    BLOCK: tl.constexpr,
):
    # First rejected position, or num_drafts when every draft is accepted.
    first_reject = tl.min(tl.where(valid & (accepted == 0), pos, BLOCK), axis=0)
    first_reject = tl.minimum(first_reject, num_drafts)
    tl.store(out_row_ptr + pos, emitted.to(tl.int32), mask=valid & (pos <= first_reject))
    if first_reject == num_drafts:
        bonus = tl.load(bonus_ptr + req)
        tl.store(out_row_ptr + num_drafts, bonus.to(tl.int32))


# out_stride follows the step's draft length, which adaptive drafting changes: not specialised.
@triton.jit(do_not_specialize=["out_stride"])
def _greedy_kernel(
    out_ptr, out_stride, cu_ptr, draft_ptr, argmax_ptr, bonus_ptr, is_greedy_ptr,
    uniform_ptr, rates_ptr,
    HAS_IS_GREEDY: tl.constexpr, SYNTHETIC: tl.constexpr, BLOCK: tl.constexpr,
):
    req = tl.program_id(0)
    if HAS_IS_GREEDY:
        if tl.load(is_greedy_ptr + req) == 0:
            return
    start, num_drafts = _request_span(cu_ptr, req)
    pos = tl.arange(0, BLOCK)
    valid = pos < num_drafts
    draft = tl.load(draft_ptr + start + pos, mask=valid, other=0).to(tl.int64)
    target = tl.load(argmax_ptr + start + pos, mask=valid, other=0).to(tl.int64)
    if SYNTHETIC:
        u = tl.load(uniform_ptr + start + pos, mask=valid, other=1.0)
        rate = tl.load(rates_ptr + pos, mask=valid, other=0.0)
        accepted = (u < rate) & (draft >= 0)
        emitted = tl.where(accepted, draft, target)
    else:
        accepted = draft == target
        emitted = target
    _store_prefix_and_bonus(
        out_ptr + req * out_stride, pos, valid, accepted, emitted, num_drafts, bonus_ptr, req,
        BLOCK,
    )


@triton.jit(do_not_specialize=["out_stride"])  # as _greedy_kernel
def _random_kernel(
    out_ptr, out_stride, cu_ptr, draft_ptr, draft_probs_ptr, target_probs_ptr, bonus_ptr,
    recovered_ptr, uniform_ptr, is_greedy_ptr, rates_ptr, vocab_size,
    HAS_IS_GREEDY: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, SYNTHETIC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    req = tl.program_id(0)
    if HAS_IS_GREEDY:
        if tl.load(is_greedy_ptr + req) != 0:
            return
    start, num_drafts = _request_span(cu_ptr, req)
    pos = tl.arange(0, BLOCK)
    valid = pos < num_drafts
    token = start + pos
    draft = tl.load(draft_ptr + token, mask=valid, other=0).to(tl.int64)
    u = tl.load(uniform_ptr + token, mask=valid, other=1.0)
    if SYNTHETIC:
        accepted = u < tl.load(rates_ptr + pos, mask=valid, other=0.0)
    else:
        column = tl.maximum(draft, 0)
        p = tl.load(target_probs_ptr + token * vocab_size + column, mask=valid, other=0.0)
        if HAS_DRAFT_PROBS:
            q = tl.load(draft_probs_ptr + token * vocab_size + column, mask=valid, other=0.0)
            accepted = (q > 0) & ((p / tl.where(q > 0, q, 1.0)) >= u)
        else:
            accepted = p >= u
    accepted = accepted & (draft >= 0)
    recovered = tl.load(recovered_ptr + token, mask=valid, other=0).to(tl.int64)
    emitted = tl.where(accepted, draft, recovered)
    _store_prefix_and_bonus(
        out_ptr + req * out_stride, pos, valid, accepted, emitted, num_drafts, bonus_ptr, req,
        BLOCK,
    )


@triton.jit
def _recovered_kernel(
    out_ptr, req_of_token_ptr, draft_ptr, draft_probs_ptr, target_probs_ptr, inv_q_ptr,
    vocab_size, HAS_DRAFT_PROBS: tl.constexpr, SCORE_FP64: tl.constexpr, BLOCK_V: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    req = tl.load(req_of_token_ptr + token).to(tl.int64)
    drafted = tl.load(draft_ptr + token).to(tl.int64)
    # The running best must keep one dtype across iterations: that of weight * inv_q.
    if SCORE_FP64:
        best_score = tl.full((), -float("inf"), tl.float64)
    else:
        best_score = tl.full((), -float("inf"), tl.float32)
    best_id = tl.full((), 0, tl.int32)
    for v0 in range(0, vocab_size, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        in_vocab = v < vocab_size
        p = tl.load(target_probs_ptr + token * vocab_size + v, mask=in_vocab, other=0.0)
        if HAS_DRAFT_PROBS:
            q = tl.load(draft_probs_ptr + token * vocab_size + v, mask=in_vocab, other=0.0)
            weight = tl.maximum(p - q, 0.0)
        else:
            weight = tl.where(v == drafted, 0.0, p)
        inv_q = tl.load(inv_q_ptr + req * vocab_size + v, mask=in_vocab, other=0.0)
        score = tl.where(in_vocab, weight * inv_q, -float("inf"))
        tile_best = tl.max(score, axis=0)
        # Lowest index among this tile's maxima, so ties resolve like torch.argmax.
        tile_id = tl.min(tl.where(score == tile_best, v, vocab_size), axis=0).to(tl.int32)
        if tile_best > best_score:
            best_score = tile_best
            best_id = tile_id
    tl.store(out_ptr + token, best_id)


def _block_for(max_spec_len: int) -> int:
    return max(16, triton.next_power_of_2(max(max_spec_len, 1)))


def rejection_greedy_sample(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_argmax: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    is_greedy: torch.Tensor | None,
    max_spec_len: int,
    uniform_probs: torch.Tensor | None = None,
    synthetic_conditional_rates: torch.Tensor | None = None,
) -> torch.Tensor:
    check_rejection_greedy_sample(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                                  target_argmax, bonus_token_ids, is_greedy, max_spec_len,
                                  uniform_probs, synthetic_conditional_rates)
    batch = output_token_ids.shape[0]
    if batch == 0:
        return output_token_ids
    synthetic = synthetic_conditional_rates is not None
    dummy = cu_num_draft_tokens
    _greedy_kernel[(batch,)](
        output_token_ids, output_token_ids.stride(0), cu_num_draft_tokens, draft_token_ids,
        target_argmax, bonus_token_ids, dummy if is_greedy is None else is_greedy,
        uniform_probs if synthetic else dummy,
        synthetic_conditional_rates if synthetic else dummy,
        HAS_IS_GREEDY=is_greedy is not None, SYNTHETIC=synthetic,
        BLOCK=_block_for(max_spec_len),
    )
    return output_token_ids


def rejection_random_sample(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    recovered_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    is_greedy: torch.Tensor | None,
    max_spec_len: int,
    synthetic_conditional_rates: torch.Tensor | None = None,
) -> torch.Tensor:
    check_rejection_random_sample(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                                  draft_probs, target_probs, bonus_token_ids,
                                  recovered_token_ids, uniform_probs, is_greedy, max_spec_len,
                                  synthetic_conditional_rates)
    batch = output_token_ids.shape[0]
    if batch == 0:
        return output_token_ids
    synthetic = synthetic_conditional_rates is not None
    dummy = cu_num_draft_tokens
    _random_kernel[(batch,)](
        output_token_ids, output_token_ids.stride(0), cu_num_draft_tokens, draft_token_ids,
        target_probs if draft_probs is None else draft_probs, target_probs, bonus_token_ids,
        recovered_token_ids, uniform_probs, dummy if is_greedy is None else is_greedy,
        synthetic_conditional_rates if synthetic else dummy, target_probs.shape[-1],
        HAS_IS_GREEDY=is_greedy is not None, HAS_DRAFT_PROBS=draft_probs is not None,
        SYNTHETIC=synthetic, BLOCK=_block_for(max_spec_len),
    )
    return output_token_ids


def sample_recovered_tokens(
    recovered_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    inv_q: torch.Tensor,
) -> torch.Tensor:
    check_sample_recovered_tokens(recovered_token_ids, cu_num_draft_tokens, draft_token_ids,
                                  draft_probs, target_probs, inv_q)
    num_tokens, vocab = target_probs.shape
    if num_tokens == 0:
        return recovered_token_ids
    req = _request_of_token(cu_num_draft_tokens, num_tokens).clamp(max=inv_q.shape[0] - 1)
    _recovered_kernel[(num_tokens,)](
        recovered_token_ids, req, draft_token_ids,
        target_probs if draft_probs is None else draft_probs, target_probs, inv_q, vocab,
        HAS_DRAFT_PROBS=draft_probs is not None, SCORE_FP64=inv_q.dtype == torch.float64,
        BLOCK_V=min(4096, triton.next_power_of_2(vocab)),
    )
    return recovered_token_ids


@triton.jit(do_not_specialize=["num_out"])  # a token count: no compile per value class
def _expand_kernel(
    out_ptr, x_ptr, cu_ptr, replace_from, replace_to, num_out, BLOCK: tl.constexpr,
):
    req = tl.program_id(0)
    start, count = _request_span(cu_ptr, req)
    value = tl.load(x_ptr + req)
    value = tl.where(value == replace_from, replace_to, value).to(value.dtype)
    for i in range(0, count, BLOCK):
        t = start + i + tl.arange(0, BLOCK)
        tl.store(out_ptr + t, value, mask=(t < start + count) & (t < num_out))


def expand_batch_to_tokens(
    out: torch.Tensor,
    x: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: int | float = 0,
    replace_to: int | float = 0,
) -> torch.Tensor:
    check_expand_batch_to_tokens(out, x, cu_num_tokens)
    batch = x.shape[0]
    if batch == 0 or out.numel() == 0:
        return out
    _expand_kernel[(batch,)](
        out, x, cu_num_tokens, replace_from, replace_to, out.shape[0], BLOCK=128,
    )
    return out
