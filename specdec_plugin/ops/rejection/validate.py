"""The rejection-sampling contract (package docstring), one check per op, run first by every
provider of that op."""
from __future__ import annotations

import torch

from specdec_plugin.ops.contract import INDEX_DTYPES, fail, same_device, values_on_host


def _check_drafts(op: str, batch: int, cu_num_draft_tokens: torch.Tensor,
                  draft_token_ids: torch.Tensor, max_spec_len: int | None) -> None:
    """The layout every op shares: ``batch`` requests owning packed draft tokens."""
    if cu_num_draft_tokens.dim() != 1 or cu_num_draft_tokens.shape[0] != batch \
            or cu_num_draft_tokens.dtype not in INDEX_DTYPES:
        fail(op, f"cu_num_draft_tokens must be int32/int64 [{batch}], got "
                 f"{cu_num_draft_tokens.dtype} {tuple(cu_num_draft_tokens.shape)}")
    if draft_token_ids.dim() != 1 or draft_token_ids.dtype not in INDEX_DTYPES:
        fail(op, f"draft_token_ids must be 1-D int32/int64, got {draft_token_ids.dtype} "
                 f"{tuple(draft_token_ids.shape)}")
    if batch and values_on_host(cu_num_draft_tokens):
        counts = torch.diff(cu_num_draft_tokens, prepend=cu_num_draft_tokens.new_zeros(1))
        if bool((counts < 0).any()) or int(cu_num_draft_tokens[-1]) > draft_token_ids.shape[0]:
            fail(op, f"cu_num_draft_tokens must be non-decreasing up to the "
                     f"{draft_token_ids.shape[0]} draft tokens")
        if max_spec_len is not None and int(counts.max()) > max_spec_len:
            fail(op, f"a request has more drafts than max_spec_len {max_spec_len}")


def _check_output(op: str, output_token_ids: torch.Tensor, bonus_token_ids: torch.Tensor,
                  is_greedy: torch.Tensor | None, max_spec_len: int) -> int:
    batch = output_token_ids.shape[0] if output_token_ids.dim() == 2 else -1
    if batch < 0 or output_token_ids.dtype != torch.int32 or max_spec_len < 0 \
            or output_token_ids.shape[1] < max_spec_len + 1:
        fail(op, f"output_token_ids must be int32 [batch, >= {max_spec_len + 1}], got "
                 f"{output_token_ids.dtype} {tuple(output_token_ids.shape)}")
    if bonus_token_ids.numel() != batch:
        fail(op, f"bonus_token_ids has {bonus_token_ids.numel()} entries for {batch} requests")
    if is_greedy is not None and (is_greedy.dim() != 1 or is_greedy.shape[0] != batch):
        fail(op, f"is_greedy must be [{batch}], got {tuple(is_greedy.shape)}")
    return batch


def _check_per_token(op: str, num_tokens: int, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None and t.shape[0] < num_tokens:
            fail(op, f"{name} has {t.shape[0]} rows for {num_tokens} draft tokens")


def _check_synthetic(op: str, uniform_probs, rates, max_spec_len: int) -> None:
    if rates is not None and (uniform_probs is None or rates.numel() < max_spec_len):
        fail(op, f"synthetic rates need uniform_probs and {max_spec_len} per-position rates")


def check_rejection_greedy_sample(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                                  target_argmax, bonus_token_ids, is_greedy, max_spec_len,
                                  uniform_probs, synthetic_conditional_rates) -> None:
    op = "rejection_greedy_sample"
    batch = _check_output(op, output_token_ids, bonus_token_ids, is_greedy, max_spec_len)
    _check_drafts(op, batch, cu_num_draft_tokens, draft_token_ids, max_spec_len)
    num_tokens = draft_token_ids.shape[0]
    _check_per_token(op, num_tokens, target_argmax=target_argmax, uniform_probs=uniform_probs)
    _check_synthetic(op, uniform_probs, synthetic_conditional_rates, max_spec_len)
    same_device(op, output_token_ids, cu_num_draft_tokens=cu_num_draft_tokens,
                draft_token_ids=draft_token_ids, target_argmax=target_argmax,
                bonus_token_ids=bonus_token_ids, is_greedy=is_greedy)


def check_rejection_random_sample(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                                  draft_probs, target_probs, bonus_token_ids,
                                  recovered_token_ids, uniform_probs, is_greedy, max_spec_len,
                                  synthetic_conditional_rates) -> None:
    op = "rejection_random_sample"
    batch = _check_output(op, output_token_ids, bonus_token_ids, is_greedy, max_spec_len)
    _check_drafts(op, batch, cu_num_draft_tokens, draft_token_ids, max_spec_len)
    _check_probs(op, draft_token_ids.shape[0], draft_probs, target_probs)
    _check_per_token(op, draft_token_ids.shape[0], recovered_token_ids=recovered_token_ids,
                     uniform_probs=uniform_probs)
    _check_synthetic(op, uniform_probs, synthetic_conditional_rates, max_spec_len)
    same_device(op, output_token_ids, cu_num_draft_tokens=cu_num_draft_tokens,
                draft_token_ids=draft_token_ids, draft_probs=draft_probs,
                target_probs=target_probs, bonus_token_ids=bonus_token_ids,
                recovered_token_ids=recovered_token_ids, uniform_probs=uniform_probs,
                is_greedy=is_greedy)


def _check_probs(op: str, num_tokens: int, draft_probs, target_probs) -> None:
    if target_probs.dim() != 2 or target_probs.shape[0] != num_tokens:
        fail(op, f"target_probs must be [{num_tokens}, vocab], got {tuple(target_probs.shape)}")
    if draft_probs is not None and draft_probs.shape != target_probs.shape:
        fail(op, f"draft_probs {tuple(draft_probs.shape)} must match target_probs "
                 f"{tuple(target_probs.shape)}")


def check_sample_recovered_tokens(recovered_token_ids, cu_num_draft_tokens, draft_token_ids,
                                  draft_probs, target_probs, inv_q) -> None:
    op = "sample_recovered_tokens"
    num_tokens = target_probs.shape[0]
    _check_drafts(op, cu_num_draft_tokens.shape[0], cu_num_draft_tokens, draft_token_ids, None)
    _check_probs(op, draft_token_ids.shape[0], draft_probs, target_probs)
    if inv_q.dim() != 2 or inv_q.shape[1] != target_probs.shape[1] \
            or inv_q.shape[0] != cu_num_draft_tokens.shape[0] or (num_tokens and not inv_q.shape[0]):
        fail(op, f"inv_q must be [{cu_num_draft_tokens.shape[0]} requests, "
                 f"{target_probs.shape[1]}], got {tuple(inv_q.shape)}")
    _check_per_token(op, num_tokens, recovered_token_ids=recovered_token_ids)
    same_device(op, target_probs, recovered_token_ids=recovered_token_ids,
                cu_num_draft_tokens=cu_num_draft_tokens, draft_token_ids=draft_token_ids,
                draft_probs=draft_probs, inv_q=inv_q)


def check_expand_batch_to_tokens(out, x, cu_num_tokens) -> None:
    op = "expand_batch_to_tokens"
    if out.dim() != 1 or x.dim() != 1:
        fail(op, f"out and x must be 1-D, got {tuple(out.shape)} and {tuple(x.shape)}")
    if cu_num_tokens.dim() != 1 or cu_num_tokens.shape[0] != x.shape[0] \
            or cu_num_tokens.dtype not in INDEX_DTYPES:
        fail(op, f"cu_num_tokens must be int32/int64 [{x.shape[0]}], got "
                 f"{cu_num_tokens.dtype} {tuple(cu_num_tokens.shape)}")
    same_device(op, out, x=x, cu_num_tokens=cu_num_tokens)
    if x.shape[0] and values_on_host(cu_num_tokens):
        if bool((torch.diff(cu_num_tokens) < 0).any()) or int(cu_num_tokens[0]) < 0:
            fail(op, "cu_num_tokens must be non-negative and non-decreasing")
