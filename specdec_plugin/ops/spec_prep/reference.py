"""Pure-torch spec-decode input preparation: the reference for every other provider and the CPU
kernels (the slot mapping runs every step for every model, the rest every EAGLE/MTP step).

All ops are flat over tokens: the owning request of a packed token comes from a
``searchsorted`` over the request boundaries, so there is neither a Python loop over requests
nor a host sync. Masked writes use ``torch.where`` into the destination buffer; scattered writes
whose index set is data-dependent go through one spare slot that swallows the masked-out lanes.
"""
from __future__ import annotations

import torch

from specdec_plugin.ops.spec_prep.validate import (
    check_compute_slot_mapping,
    check_copy_and_expand_eagle_inputs,
    check_eagle_prepare_inputs_padded,
    check_eagle_prepare_next_token_padded,
    check_eagle_step_slot_mapping_metadata,
)

PAD_SLOT_ID = -1


def _owner(ends: torch.Tensor, idx: torch.Tensor, starts: torch.Tensor):
    """Request owning each index, given sorted per-request [start, end) ranges, and validity."""
    req = torch.searchsorted(ends, idx.to(ends.dtype), right=True)
    n = ends.shape[0]
    safe = req.clamp(max=max(n - 1, 0))
    owned = (req < n) & (idx >= starts[safe])
    return safe, owned


def _masked_write(dst: torch.Tensor, owned: torch.Tensor, value: torch.Tensor) -> None:
    n = owned.shape[0]
    dst[:n] = torch.where(owned, value.to(dst.dtype), dst[:n])


def _masked_scatter(dst: torch.Tensor, index: torch.Tensor, keep: torch.Tensor, value) -> None:
    """``dst[index[keep]] = value[keep]`` without the host sync of boolean indexing."""
    spare = dst.new_empty(dst.shape[0] + 1)
    spare[:-1] = dst
    index = torch.where(keep, index.long(), dst.shape[0])
    spare.scatter_(0, index, value.to(dst.dtype))
    dst.copy_(spare[:-1])


def compute_slot_mapping(
    slot_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    num_reqs: int,
    num_tokens: int,
    max_num_tokens: int,
    pad_id: int = PAD_SLOT_ID,
    kv_cache_block_size: int | None = None,
    blocks_per_kv_block: int = 1,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_interleave_size: int = 1,
) -> None:
    """``slot_mapping[t]`` for the tokens of requests ``0..num_reqs-1``, ``pad_id`` for
    ``[num_tokens, max_num_tokens)``.

    ``block_size`` is the attention kernel's block size; ``kv_cache_block_size`` the allocation
    block size (``block_size * blocks_per_kv_block``). Under decode context parallelism a token
    whose position is not stored on ``cp_rank`` gets ``pad_id``.
    """
    check_compute_slot_mapping(slot_mapping, query_start_loc, positions, block_table,
                               block_size, num_reqs, num_tokens, max_num_tokens,
                               blocks_per_kv_block, cp_world_size, cp_rank)
    if kv_cache_block_size is None:
        kv_cache_block_size = block_size * blocks_per_kv_block
    if max_num_tokens > num_tokens:
        slot_mapping[num_tokens:max_num_tokens] = pad_id
    if num_reqs == 0 or num_tokens == 0:
        return
    qsl = query_start_loc[: num_reqs + 1].long()
    t = torch.arange(num_tokens, device=positions.device)
    req, owned = _owner(qsl[1:], t, qsl[:-1])

    pos = torch.where(owned, positions[:num_tokens].long(), 0)
    virtual_block_size = kv_cache_block_size * cp_world_size
    virtual_block = pos // virtual_block_size
    virtual_offset = pos - virtual_block * virtual_block_size
    is_local = (virtual_offset // cp_interleave_size) % cp_world_size == cp_rank
    local_offset = (
        virtual_offset // (cp_world_size * cp_interleave_size)
    ) * cp_interleave_size + virtual_offset % cp_interleave_size
    block_index = virtual_block * blocks_per_kv_block + local_offset // block_size
    block_index = block_index.clamp(0, block_table.shape[1] - 1)
    block_number = block_table[req, block_index].long()
    slots = block_number * block_size + local_offset % block_size
    slots = torch.where(is_local, slots, pad_id)
    _masked_write(slot_mapping, owned, slots)


def eagle_step_slot_mapping_metadata(
    positions: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out_clamped_positions: torch.Tensor,
    out_slot_mapping: torch.Tensor,
    block_size: int,
    max_model_len: int,
    batch_size: int,
    input_batch_size: int,
    pad_id: int = PAD_SLOT_ID,
) -> None:
    """One drafting step for requests ``0..batch_size-1``: position + 1 (0 past
    ``max_model_len``), its KV slot (``pad_id`` past the limit), ``seq_lens`` + 1 in place (1 past
    the limit, capped at ``max_model_len``). Rows ``[batch_size, input_batch_size)`` of the slot
    mapping are graph padding and get ``pad_id``."""
    check_eagle_step_slot_mapping_metadata(positions, block_table, seq_lens,
                                           out_clamped_positions, out_slot_mapping, block_size,
                                           batch_size, input_batch_size)
    if input_batch_size > batch_size:
        out_slot_mapping[batch_size:input_batch_size] = pad_id
    if batch_size == 0:
        return
    new_pos = positions[:batch_size].long() + 1
    exceeds = new_pos >= max_model_len
    clamped = torch.where(exceeds, 0, new_pos)
    block_index = (clamped // block_size).clamp(max=block_table.shape[1] - 1)
    rows = torch.arange(batch_size, device=positions.device)
    block_id = block_table[rows, block_index].long()
    slot = torch.where(exceeds, pad_id, block_id * block_size + clamped % block_size)
    new_len = torch.where(exceeds, 1, seq_lens[:batch_size].long() + 1).clamp(max=max_model_len)
    out_clamped_positions[:batch_size] = clamped.to(out_clamped_positions.dtype)
    out_slot_mapping[:batch_size] = slot.to(out_slot_mapping.dtype)
    seq_lens[:batch_size] = new_len.to(seq_lens.dtype)


def eagle_prepare_inputs_padded(
    cu_num_draft_tokens: torch.Tensor,
    valid_sampled_tokens_count: torch.Tensor,
    query_start_loc: torch.Tensor,
    token_indices_to_sample: torch.Tensor,
    num_rejected_tokens: torch.Tensor,
    num_reqs: int,
) -> None:
    """Per request: rejected = drafts + 1 - valid (0 without drafts); the token to sample from is
    the request's last query token minus the rejected ones."""
    check_eagle_prepare_inputs_padded(cu_num_draft_tokens, valid_sampled_tokens_count,
                                      query_start_loc, token_indices_to_sample,
                                      num_rejected_tokens, num_reqs)
    if num_reqs == 0:
        return
    cu = cu_num_draft_tokens[:num_reqs].long()
    num_drafts = cu - torch.cat([cu.new_zeros(1), cu[:-1]])
    rejected = num_drafts + 1 - valid_sampled_tokens_count[:num_reqs].long()
    rejected = torch.where(num_drafts > 0, rejected, 0)
    last_token = query_start_loc[1 : num_reqs + 1].long() - 1
    token_indices_to_sample[:num_reqs] = (last_token - rejected).to(token_indices_to_sample.dtype)
    num_rejected_tokens[:num_reqs] = rejected.to(num_rejected_tokens.dtype)


def eagle_prepare_next_token_padded(
    sampled_token_ids: torch.Tensor,
    discard_request_mask: torch.Tensor,
    backup_next_token_ids: torch.Tensor,
    next_token_ids: torch.Tensor,
    valid_sampled_tokens_count: torch.Tensor,
    vocab_size: int,
    num_sampled_tokens_per_req: int,
    num_reqs: int,
) -> None:
    """Per request: valid count = sampled ids that are not -1 and < vocab_size (0 if discarded);
    next token = the last valid one, or the backup token if none / discarded."""
    check_eagle_prepare_next_token_padded(sampled_token_ids, discard_request_mask,
                                          backup_next_token_ids, next_token_ids,
                                          valid_sampled_tokens_count,
                                          num_sampled_tokens_per_req, num_reqs)
    if num_reqs == 0:
        return
    tokens = sampled_token_ids[:num_reqs, :num_sampled_tokens_per_req].long()
    valid = (tokens != -1) & (tokens < vocab_size)
    discarded = discard_request_mask[:num_reqs].bool()
    count = torch.where(discarded, 0, valid.sum(dim=1))
    col = torch.arange(tokens.shape[1], device=tokens.device)
    last = torch.where(valid, col, -1).amax(dim=1, keepdim=True) if tokens.shape[1] else None
    backup = backup_next_token_ids[:num_reqs].long()
    if last is None:
        nxt = backup
    else:
        last_token = tokens.gather(1, last.clamp_min(0)).squeeze(1)
        nxt = torch.where(discarded | (count == 0), backup, last_token)
    next_token_ids[:num_reqs] = nxt.to(next_token_ids.dtype)
    valid_sampled_tokens_count[:num_reqs] = count.to(valid_sampled_tokens_count.dtype)


def copy_and_expand_eagle_inputs(
    target_token_ids: torch.Tensor,
    target_positions: torch.Tensor,
    next_token_ids: torch.Tensor,
    out_input_ids: torch.Tensor,
    out_positions: torch.Tensor,
    out_is_rejected_token_mask: torch.Tensor,
    out_is_masked_token_mask: torch.Tensor,
    out_new_token_indices: torch.Tensor,
    out_hidden_state_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    query_end_loc: torch.Tensor,
    padding_token_id: int,
    parallel_drafting_token_id: int,
    total_input_tokens: int,
    num_padding_slots_per_request: int,
    shift_input_ids: bool,
    num_reqs: int,
) -> None:
    """Drafter inputs with extra slots per request (parallel drafting).

    Request r's output run starts at ``qsl[r] + r * (P - shift)`` and holds: its valid input tokens
    (shifted by one when ``shift_input_ids``), the bonus token ``next_token_ids[r]``, ``P - 1``
    parallel-drafting tokens (masked), then one padding token per rejected draft (rejected; their
    position is 0). Positions count up from the request's first input position.
    ``out_new_token_indices[r * P + k]`` is the output index of the k-th new (bonus/parallel) slot,
    ``out_hidden_state_mapping[i]`` (shift only) the output index of input token i.
    """
    check_copy_and_expand_eagle_inputs(target_token_ids, target_positions, next_token_ids,
                                       out_input_ids, out_positions,
                                       out_is_rejected_token_mask, out_is_masked_token_mask,
                                       out_new_token_indices, out_hidden_state_mapping,
                                       query_start_loc, query_end_loc, total_input_tokens,
                                       num_padding_slots_per_request, num_reqs)
    if num_reqs == 0:
        return
    P = num_padding_slots_per_request
    shift = bool(shift_input_ids)
    device = query_start_loc.device
    qs = query_start_loc[:num_reqs].long()
    nqs = query_start_loc[1 : num_reqs + 1].long()
    qe = query_end_loc[:num_reqs].long()
    r_all = torch.arange(num_reqs, device=device)
    num_valid = qe - qs + (0 if shift else 1)
    out_start = qs + r_all * (P - 1 if shift else P)
    total = num_valid + P + (nqs - qe - 1)

    bound = total_input_tokens + num_reqs * P
    num_out = min(
        bound, out_input_ids.shape[0], out_positions.shape[0],
        out_is_rejected_token_mask.shape[0], out_is_masked_token_mask.shape[0],
    )
    o = torch.arange(num_out, device=device)
    r, owned = _owner(out_start + total, o, out_start)
    j = o - out_start[r]
    nv = num_valid[r]
    is_valid = j < nv
    is_bonus = j == nv
    is_parallel = (j > nv) & (j < nv + P)
    is_rejected = j >= nv + P

    last_input = max(total_input_tokens - 1, 0)
    in_idx = (qs[r] + (1 if shift else 0) + j).clamp(0, last_input)
    tokens = torch.where(is_valid, target_token_ids[in_idx].long(), 0)
    tokens = torch.where(is_bonus, next_token_ids[r].long(), tokens)
    tokens = torch.where(is_parallel, parallel_drafting_token_id, tokens)
    tokens = torch.where(is_rejected, padding_token_id, tokens)
    start_pos = target_positions[qs.clamp(max=last_input)].long()[r]
    positions = torch.where(is_rejected, 0, start_pos + j)

    _masked_write(out_input_ids, owned, tokens)
    _masked_write(out_positions, owned, positions)
    _masked_write(out_is_rejected_token_mask, owned, is_rejected)
    _masked_write(out_is_masked_token_mask, owned, is_parallel)
    is_new = owned & (j >= nv) & (j < nv + P)
    _masked_scatter(out_new_token_indices, r * P + (j - nv), is_new, o)

    if shift and total_input_tokens > 0:
        i = torch.arange(min(total_input_tokens, out_hidden_state_mapping.shape[0]), device=device)
        ri, in_owned = _owner(nqs, i, qs)
        _masked_write(out_hidden_state_mapping, in_owned, out_start[ri] + (i - qs[ri]))


