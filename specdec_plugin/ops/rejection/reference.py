"""Pure-torch rejection-sampling kernels: the reference for every other provider and the kernels
the CPU platform runs every speculative step.

Everything is batched over requests: per-request draft positions are laid out as a padded
``[batch, max_spec_len]`` grid gathered from the packed token arrays, and "stop at the first
rejection" is an exclusive cumulative product along that grid. No host syncs: shapes and the
Python ``max_spec_len`` are the only host values used.
"""
from __future__ import annotations

import torch

from specdec_plugin.ops.rejection.validate import (
    check_expand_batch_to_tokens,
    check_rejection_greedy_sample,
    check_rejection_random_sample,
    check_sample_recovered_tokens,
)

PLACEHOLDER_TOKEN_ID = -1


def _padded_draft_layout(cu_num_draft_tokens: torch.Tensor, max_spec_len: int):
    """Token index of (request, position), whether it is a real draft, and per-request counts."""
    cu = cu_num_draft_tokens.long()
    starts = torch.cat([cu.new_zeros(1), cu[:-1]])
    counts = cu - starts
    pos = torch.arange(max_spec_len, device=cu.device)
    valid = pos[None, :] < counts[:, None]
    index = torch.where(valid, starts[:, None] + pos[None, :], torch.zeros_like(pos)[None, :])
    return index, valid, counts


def _write_accepted_prefix(
    output_token_ids: torch.Tensor,
    accepted: torch.Tensor,  # [batch, S] bool, per draft position
    emitted: torch.Tensor,  # [batch, S] token written at each position reached
    valid: torch.Tensor,  # [batch, S] bool
    counts: torch.Tensor,  # [batch] number of drafts
    bonus_token_ids: torch.Tensor,  # [batch, 1] or [batch]
    rows: torch.Tensor | None,  # [batch] bool, rows this kernel owns; None = all
) -> None:
    """Write positions up to and including the first rejection; bonus token if none rejected."""
    batch, width = accepted.shape
    accepted_or_pad = accepted | ~valid
    # reached[b, p]: every draft before p was accepted, so position p gets written.
    reached = torch.cat(
        [accepted_or_pad.new_ones(batch, 1), accepted_or_pad[:, :-1].cumprod(dim=1).bool()], dim=1
    )[:, :width]
    write = reached & valid
    all_accepted = accepted_or_pad.all(dim=1)
    if rows is not None:
        write &= rows[:, None]
        all_accepted &= rows
    out = output_token_ids
    if width > 0:
        out[:, :width] = torch.where(write, emitted.to(out.dtype), out[:, :width])
    col = counts.clamp(max=out.shape[1] - 1)[:, None]
    bonus = bonus_token_ids.reshape(batch, 1).to(out.dtype)
    out.scatter_(1, col, torch.where(all_accepted[:, None], bonus, out.gather(1, col)))


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
    """Greedy rows: emit target argmax until the first draft != argmax; bonus if none differs.

    With ``synthetic_conditional_rates`` (synthetic acceptance mode) a non-padded draft at
    position p is accepted iff ``uniform_probs < rate[p]`` and the draft itself is emitted.
    """
    check_rejection_greedy_sample(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                                  target_argmax, bonus_token_ids, is_greedy, max_spec_len,
                                  uniform_probs, synthetic_conditional_rates)
    batch = output_token_ids.shape[0]
    if batch == 0:
        return output_token_ids
    width = max_spec_len if draft_token_ids.numel() > 0 else 0
    index, valid, counts = _padded_draft_layout(cu_num_draft_tokens, width)
    draft = draft_token_ids[index].long()
    argmax = target_argmax[index].long()
    if synthetic_conditional_rates is not None:
        assert uniform_probs is not None
        rate = synthetic_conditional_rates[:width].to(torch.float64)
        accepted = (uniform_probs[index] < rate[None, :]) & (draft >= 0)
        emitted = torch.where(accepted, draft, argmax)
    else:
        accepted = draft == argmax
        emitted = argmax
    rows = None if is_greedy is None else is_greedy.bool()
    _write_accepted_prefix(
        output_token_ids, accepted, emitted, valid, counts, bonus_token_ids, rows
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
    """Non-greedy rows: accept draft x iff ``uniform <= p(x) / q(x)`` (q = 1 without draft probs),
    emit the recovered token at the first rejection, the bonus token if nothing is rejected."""
    check_rejection_random_sample(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                                  draft_probs, target_probs, bonus_token_ids,
                                  recovered_token_ids, uniform_probs, is_greedy, max_spec_len,
                                  synthetic_conditional_rates)
    batch = output_token_ids.shape[0]
    if batch == 0:
        return output_token_ids
    width = max_spec_len if draft_token_ids.numel() > 0 else 0
    index, valid, counts = _padded_draft_layout(cu_num_draft_tokens, width)

    draft_flat = draft_token_ids.long()
    if synthetic_conditional_rates is not None:
        accepted = uniform_probs[index] < synthetic_conditional_rates[:width].to(torch.float64)
    else:
        column = draft_flat.clamp_min(0)[:, None]
        target_p = target_probs.gather(1, column).squeeze(1)
        if draft_probs is None:
            ratio_ok = target_p >= uniform_probs
        else:
            draft_p = draft_probs.gather(1, column).squeeze(1)
            # A zero draft probability would give NaN/inf: reject instead (as vLLM does).
            ratio_ok = (draft_p > 0) & ((target_p / draft_p) >= uniform_probs)
        accepted = ratio_ok[index]
    draft = draft_flat[index]
    accepted = accepted & (draft >= 0)
    emitted = torch.where(accepted, draft, recovered_token_ids[index].long())
    rows = None if is_greedy is None else ~is_greedy.bool()
    _write_accepted_prefix(
        output_token_ids, accepted, emitted, valid, counts, bonus_token_ids, rows
    )
    return output_token_ids


def _request_of_token(cu_num_tokens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Request index owning each packed token (== batch for tokens past ``cu[-1]``)."""
    t = torch.arange(num_tokens, device=cu_num_tokens.device, dtype=cu_num_tokens.dtype)
    return torch.searchsorted(cu_num_tokens, t, right=True)


def sample_recovered_tokens(
    recovered_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    inv_q: torch.Tensor,
) -> torch.Tensor:
    """``recovered[t] = argmax_v weight[t, v] * inv_q[request(t), v]``.

    ``weight = max(0, p - q)`` with draft probs, else p with the drafted token zeroed. Since
    ``inv_q = 1 / Exp(1)``, the argmax is a sample from ``weight / sum(weight)`` (exponential race),
    so no normalisation is needed.
    """
    check_sample_recovered_tokens(recovered_token_ids, cu_num_draft_tokens, draft_token_ids,
                                  draft_probs, target_probs, inv_q)
    num_tokens, vocab = target_probs.shape
    if num_tokens == 0:
        return recovered_token_ids
    batch = inv_q.shape[0]
    req = _request_of_token(cu_num_draft_tokens, num_tokens).clamp(max=batch - 1)
    if draft_probs is None:
        drafted = torch.arange(vocab, device=target_probs.device)[None, :] == (
            draft_token_ids[:num_tokens].long()[:, None]
        )
        weight = target_probs.masked_fill(drafted, 0.0)
    else:
        weight = (target_probs - draft_probs).clamp_min(0.0)
    recovered = (weight * inv_q[req]).argmax(dim=-1)
    recovered_token_ids[:num_tokens] = recovered.to(recovered_token_ids.dtype)
    return recovered_token_ids


def expand_batch_to_tokens(
    out: torch.Tensor,
    x: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: int | float = 0,
    replace_to: int | float = 0,
) -> torch.Tensor:
    """``out[t] = x[request(t)]`` (``replace_from`` mapped to ``replace_to``) for ``t < cu[-1]``."""
    check_expand_batch_to_tokens(out, x, cu_num_tokens)
    batch = x.shape[0]
    if batch == 0 or out.numel() == 0:
        return out
    req = _request_of_token(cu_num_tokens, out.shape[0])
    owned = req < batch
    value = torch.where(x == replace_from, replace_to, x).to(out.dtype)
    out.copy_(torch.where(owned, value[req.clamp(max=batch - 1)], out))
    return out
