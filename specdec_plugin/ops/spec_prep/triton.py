"""Triton spec-decode input preparation; same signatures and results as ``reference.py``.

Per-request ops run one program per request that walks its tokens in ``BLOCK``-wide tiles (the
per-request token count is only known on the device); per-batch ops run one program per
``BLOCK`` requests. Counts that change from step to step (requests, tokens) are not specialised:
Triton would compile a new variant when one of them first equals 1 or a multiple of 16, and a
compile in the middle of serving stalls that step.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_plugin.ops.spec_prep.reference import PAD_SLOT_ID
from specdec_plugin.ops.spec_prep.validate import (
    check_compute_slot_mapping,
    check_copy_and_expand_eagle_inputs,
    check_eagle_prepare_inputs_padded,
    check_eagle_prepare_next_token_padded,
    check_eagle_step_slot_mapping_metadata,
)

_BLOCK = 128


# num_tokens changes every step: one compiled variant for all of its values (a value of 1, at
# batch 1, would otherwise compile a variant of its own in the middle of serving).
@triton.jit(do_not_specialize=["num_tokens"])
def _slot_mapping_kernel(
    slot_ptr, qsl_ptr, pos_ptr, bt_ptr, bt_stride, bt_width, block_size, pad_id, num_tokens,
    KV_BLOCK: tl.constexpr, BLOCKS_PER_KV_BLOCK: tl.constexpr, CP_SIZE: tl.constexpr,
    CP_RANK: tl.constexpr, CP_INTERLEAVE: tl.constexpr, BLOCK: tl.constexpr,
):
    req = tl.program_id(0)
    start = tl.load(qsl_ptr + req).to(tl.int64)
    # Tokens past num_tokens are padding (written pad_id by the host): never walk into them.
    end = tl.minimum(tl.load(qsl_ptr + req + 1).to(tl.int64), num_tokens)
    for t0 in range(start, end, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        live = t < end
        pos = tl.load(pos_ptr + t, mask=live, other=0).to(tl.int64)
        vblock = pos // (KV_BLOCK * CP_SIZE)
        voff = pos - vblock * (KV_BLOCK * CP_SIZE)
        local = (voff // CP_INTERLEAVE) % CP_SIZE == CP_RANK
        loff = (voff // (CP_SIZE * CP_INTERLEAVE)) * CP_INTERLEAVE + voff % CP_INTERLEAVE
        bidx = vblock * BLOCKS_PER_KV_BLOCK + loff // block_size
        bidx = tl.minimum(tl.maximum(bidx, 0), bt_width - 1)
        block = tl.load(bt_ptr + req * bt_stride + bidx, mask=live & local, other=0).to(tl.int64)
        slot = tl.where(local, block * block_size + loff % block_size, pad_id)
        tl.store(slot_ptr + t, slot, mask=live)


def compute_slot_mapping(
    slot_mapping, query_start_loc, positions, block_table, block_size, num_reqs, num_tokens,
    max_num_tokens, pad_id=PAD_SLOT_ID, kv_cache_block_size=None, blocks_per_kv_block=1,
    cp_world_size=1, cp_rank=0, cp_interleave_size=1,
) -> None:
    check_compute_slot_mapping(slot_mapping, query_start_loc, positions, block_table,
                               block_size, num_reqs, num_tokens, max_num_tokens,
                               blocks_per_kv_block, cp_world_size, cp_rank)
    if kv_cache_block_size is None:
        kv_cache_block_size = block_size * blocks_per_kv_block
    if max_num_tokens > num_tokens:
        slot_mapping[num_tokens:max_num_tokens].fill_(pad_id)
    if num_reqs == 0 or num_tokens == 0:
        return
    _slot_mapping_kernel[(num_reqs,)](
        slot_mapping, query_start_loc, positions, block_table, block_table.stride(0),
        block_table.shape[1], block_size, pad_id, num_tokens,
        KV_BLOCK=kv_cache_block_size, BLOCKS_PER_KV_BLOCK=blocks_per_kv_block,
        CP_SIZE=cp_world_size, CP_RANK=cp_rank, CP_INTERLEAVE=cp_interleave_size, BLOCK=_BLOCK,
    )


@triton.jit(do_not_specialize=["batch_size", "input_batch_size"])
def _eagle_step_kernel(
    pos_ptr, bt_ptr, bt_stride, bt_width, seq_lens_ptr, out_pos_ptr, out_slot_ptr,
    block_size, max_model_len, batch_size, input_batch_size, pad_id, BLOCK: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    real = r < batch_size
    tl.store(out_slot_ptr + r, tl.zeros((BLOCK,), tl.int64) + pad_id,
             mask=(r >= batch_size) & (r < input_batch_size))
    new_pos = tl.load(pos_ptr + r, mask=real, other=0).to(tl.int64) + 1
    exceeds = new_pos >= max_model_len
    clamped = tl.where(exceeds, 0, new_pos)
    bidx = tl.minimum(clamped // block_size, bt_width - 1)
    block = tl.load(bt_ptr + r * bt_stride + bidx, mask=real, other=0).to(tl.int64)
    slot = tl.where(exceeds, pad_id, block * block_size + clamped % block_size)
    seq_len = tl.load(seq_lens_ptr + r, mask=real, other=0)
    new_len = tl.minimum(tl.where(exceeds, 1, seq_len + 1), max_model_len)
    tl.store(out_pos_ptr + r, clamped, mask=real)
    tl.store(out_slot_ptr + r, slot, mask=real)
    tl.store(seq_lens_ptr + r, new_len, mask=real)


def eagle_step_slot_mapping_metadata(
    positions, block_table, seq_lens, out_clamped_positions, out_slot_mapping, block_size,
    max_model_len, batch_size, input_batch_size, pad_id=PAD_SLOT_ID,
) -> None:
    check_eagle_step_slot_mapping_metadata(positions, block_table, seq_lens,
                                           out_clamped_positions, out_slot_mapping, block_size,
                                           batch_size, input_batch_size)
    n = max(batch_size, input_batch_size)
    if n == 0:
        return
    _eagle_step_kernel[(triton.cdiv(n, _BLOCK),)](
        positions, block_table, block_table.stride(0), block_table.shape[1], seq_lens,
        out_clamped_positions, out_slot_mapping, block_size, max_model_len, batch_size,
        input_batch_size, pad_id, BLOCK=_BLOCK,
    )


@triton.jit(do_not_specialize=["num_reqs"])
def _prepare_inputs_padded_kernel(
    cu_ptr, valid_count_ptr, qsl_ptr, out_index_ptr, out_rejected_ptr, num_reqs,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    real = r < num_reqs
    cu = tl.load(cu_ptr + r, mask=real, other=0)
    cu_prev = tl.load(cu_ptr + r - 1, mask=real & (r > 0), other=0)
    num_drafts = cu - cu_prev
    valid = tl.load(valid_count_ptr + r, mask=real, other=0)
    rejected = tl.where(num_drafts > 0, num_drafts + 1 - valid, 0)
    last = tl.load(qsl_ptr + r + 1, mask=real, other=0) - 1
    tl.store(out_index_ptr + r, last - rejected, mask=real)
    tl.store(out_rejected_ptr + r, rejected, mask=real)


def eagle_prepare_inputs_padded(
    cu_num_draft_tokens, valid_sampled_tokens_count, query_start_loc, token_indices_to_sample,
    num_rejected_tokens, num_reqs,
) -> None:
    check_eagle_prepare_inputs_padded(cu_num_draft_tokens, valid_sampled_tokens_count,
                                      query_start_loc, token_indices_to_sample,
                                      num_rejected_tokens, num_reqs)
    if num_reqs == 0:
        return
    _prepare_inputs_padded_kernel[(triton.cdiv(num_reqs, _BLOCK),)](
        cu_num_draft_tokens, valid_sampled_tokens_count, query_start_loc,
        token_indices_to_sample, num_rejected_tokens, num_reqs, BLOCK=_BLOCK,
    )


# The sampled width is 1 on adaptive drafting's plain steps and 1+K otherwise: not specialised.
@triton.jit(do_not_specialize=["sampled_stride", "num_cols"])
def _next_token_padded_kernel(
    sampled_ptr, sampled_stride, discard_ptr, backup_ptr, next_ptr, count_ptr, vocab_size,
    num_cols, BLOCK: tl.constexpr,
):
    r = tl.program_id(0)
    col = tl.arange(0, BLOCK)
    in_row = col < num_cols
    tok = tl.load(sampled_ptr + r * sampled_stride + col, mask=in_row, other=-1)
    valid = (tok != -1) & (tok < vocab_size) & in_row
    discarded = tl.load(discard_ptr + r) != 0
    count = tl.sum(valid.to(tl.int32), axis=0)
    last_col = tl.max(tl.where(valid, col, -1), axis=0)
    last_tok = tl.sum(tl.where(col == last_col, tok, 0), axis=0)
    backup = tl.load(backup_ptr + r)
    use_backup = discarded | (count == 0)
    tl.store(next_ptr + r, tl.where(use_backup, backup, last_tok))
    tl.store(count_ptr + r, tl.where(discarded, 0, count))


def eagle_prepare_next_token_padded(
    sampled_token_ids, discard_request_mask, backup_next_token_ids, next_token_ids,
    valid_sampled_tokens_count, vocab_size, num_sampled_tokens_per_req, num_reqs,
) -> None:
    check_eagle_prepare_next_token_padded(sampled_token_ids, discard_request_mask,
                                          backup_next_token_ids, next_token_ids,
                                          valid_sampled_tokens_count,
                                          num_sampled_tokens_per_req, num_reqs)
    if num_reqs == 0:
        return
    _next_token_padded_kernel[(num_reqs,)](
        sampled_token_ids, sampled_token_ids.stride(0), discard_request_mask,
        backup_next_token_ids, next_token_ids, valid_sampled_tokens_count, vocab_size,
        num_sampled_tokens_per_req, BLOCK=max(16, triton.next_power_of_2(num_sampled_tokens_per_req)),
    )


# The token counts change every step: specialised (1, a multiple of 16, other), they compiled
# four variants while a draft-model engine served batches 1, 16 and 64 (H100, 2026-11-25).
@triton.jit(do_not_specialize=["total_input_tokens", "num_out", "num_hidden"])
def _eagle_expand_kernel(
    tok_ptr, tpos_ptr, next_ptr, out_ids_ptr, out_pos_ptr, out_rej_ptr, out_masked_ptr,
    out_new_ptr, out_hidden_ptr, qsl_ptr, qend_ptr, padding_token_id, parallel_token_id,
    total_input_tokens, P, num_out, num_hidden, SHIFT: tl.constexpr, BLOCK: tl.constexpr,
):
    # num_out / num_hidden: how far the outputs / the hidden-state mapping may be written (the
    # reference's contract: the output bound and the buffers' lengths, whichever is smaller).
    r = tl.program_id(0)
    qs = tl.load(qsl_ptr + r).to(tl.int64)
    nqs = tl.load(qsl_ptr + r + 1).to(tl.int64)
    qe = tl.load(qend_ptr + r).to(tl.int64)
    if SHIFT:
        num_valid = qe - qs
        out_start = qs + r * (P - 1)
    else:
        num_valid = qe - qs + 1
        out_start = qs + r * P
    total = num_valid + P + (nqs - qe - 1)
    start_pos = tl.load(tpos_ptr + tl.minimum(qs, total_input_tokens - 1)).to(tl.int64)
    bonus = tl.load(next_ptr + r).to(tl.int64)
    span = tl.maximum(total, nqs - qs)
    for j0 in range(0, span, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        o = out_start + j
        live = (j < total) & (o < num_out)
        is_valid = j < num_valid
        is_new = (j >= num_valid) & (j < num_valid + P)
        is_parallel = is_new & (j > num_valid)
        is_rejected = j >= num_valid + P
        src = tl.minimum(qs + (1 if SHIFT else 0) + j, total_input_tokens - 1)
        tok = tl.load(tok_ptr + src, mask=live & is_valid, other=0).to(tl.int64)
        tok = tl.where(j == num_valid, bonus, tok)
        tok = tl.where(is_parallel, parallel_token_id, tok)
        tok = tl.where(is_rejected, padding_token_id, tok)
        tl.store(out_ids_ptr + o, tok, mask=live)
        tl.store(out_pos_ptr + o, tl.where(is_rejected, 0, start_pos + j), mask=live)
        tl.store(out_rej_ptr + o, is_rejected, mask=live)
        tl.store(out_masked_ptr + o, is_parallel, mask=live)
        tl.store(out_new_ptr + r * P + (j - num_valid), o, mask=live & is_new)
        if SHIFT:
            tl.store(out_hidden_ptr + qs + j, o, mask=(j < nqs - qs) & (qs + j < num_hidden))


def copy_and_expand_eagle_inputs(
    target_token_ids, target_positions, next_token_ids, out_input_ids, out_positions,
    out_is_rejected_token_mask, out_is_masked_token_mask, out_new_token_indices,
    out_hidden_state_mapping, query_start_loc, query_end_loc, padding_token_id,
    parallel_drafting_token_id, total_input_tokens, num_padding_slots_per_request,
    shift_input_ids, num_reqs,
) -> None:
    check_copy_and_expand_eagle_inputs(target_token_ids, target_positions, next_token_ids,
                                       out_input_ids, out_positions,
                                       out_is_rejected_token_mask, out_is_masked_token_mask,
                                       out_new_token_indices, out_hidden_state_mapping,
                                       query_start_loc, query_end_loc, total_input_tokens,
                                       num_padding_slots_per_request, num_reqs)
    if num_reqs == 0:
        return
    num_out = min(total_input_tokens + num_reqs * num_padding_slots_per_request,
                  out_input_ids.shape[0], out_positions.shape[0],
                  out_is_rejected_token_mask.shape[0], out_is_masked_token_mask.shape[0])
    num_hidden = min(total_input_tokens, out_hidden_state_mapping.shape[0])
    _eagle_expand_kernel[(num_reqs,)](
        target_token_ids, target_positions, next_token_ids, out_input_ids, out_positions,
        out_is_rejected_token_mask, out_is_masked_token_mask, out_new_token_indices,
        out_hidden_state_mapping, query_start_loc, query_end_loc, padding_token_id,
        parallel_drafting_token_id, total_input_tokens, num_padding_slots_per_request, num_out,
        num_hidden, SHIFT=bool(shift_input_ids), BLOCK=_BLOCK,
    )


