"""Triton drafter-batch padding; same signature and results as ``reference.py``.

One program per padded request: it writes its ``query_len`` token slots (ids, positions, KV
slots, hidden-state rows) and its per-request values, whether it holds a real request or a
filler, so one launch replaces the reference's dozen and nothing is left from an earlier step.
"""
from __future__ import annotations

import triton
import triton.language as tl

from specdec_plugin.ops.drafter_pad.validate import check_pad_drafter_batch

_BLOCK_H = 256
_BLOCK_W = 128


# num_reqs is the live batch (1 at batch 1): not specialised, so the variant compiled at start-up
# serves every batch size.
@triton.jit(do_not_specialize=["num_reqs"])
def _pad_drafter_batch_kernel(
    ids_ptr, pos_ptr, hidden_ptr, hidden_stride, next_ptr, tis_ptr, rej_ptr, qsl_ptr,
    seq_ptr, bt_ptr, bt_stride, slot_ptr,
    o_ids_ptr, o_pos_ptr, o_hidden_ptr, o_hidden_stride, o_next_ptr, o_tis_ptr, o_rej_ptr,
    o_seq_ptr, o_bt_ptr, o_bt_stride, o_slot_ptr,
    num_reqs, hidden_size, width_in, width_out, fake_position,
    QUERY_LEN: tl.constexpr, Q_BLOCK: tl.constexpr, HAS_TIS: tl.constexpr,
    HAS_REJ: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):
    req = tl.program_id(0)
    real = req < num_reqs
    start = tl.load(qsl_ptr + req, mask=real, other=0).to(tl.int64)
    end = tl.load(qsl_ptr + req + 1, mask=real, other=0).to(tl.int64)
    length = end - start  # 0 for a filler request
    offset = tl.arange(0, Q_BLOCK)
    in_query = offset < QUERY_LEN
    is_token = offset < length
    src = start + offset
    dst = req.to(tl.int64) * QUERY_LEN + offset

    token = tl.load(ids_ptr + src, mask=is_token, other=0)
    tl.store(o_ids_ptr + dst, token, mask=in_query)
    last_pos = tl.load(pos_ptr + end - 1, mask=real, other=0).to(tl.int64)
    filler_pos = tl.where(real, tl.minimum(last_pos + offset - length + 1, fake_position),
                          fake_position)
    pos = tl.load(pos_ptr + src, mask=is_token, other=0).to(tl.int64)
    tl.store(o_pos_ptr + dst, tl.where(is_token, pos, filler_pos), mask=in_query)
    slot = tl.load(slot_ptr + src, mask=is_token, other=-1).to(tl.int64)
    tl.store(o_slot_ptr + dst, slot, mask=in_query)

    cols = tl.arange(0, BLOCK_H)
    for h in range(0, hidden_size, BLOCK_H):
        c = h + cols
        in_h = c < hidden_size
        rows = tl.load(hidden_ptr + src[:, None] * hidden_stride + c[None, :],
                       mask=is_token[:, None] & in_h[None, :], other=0.0)
        tl.store(o_hidden_ptr + dst[:, None] * o_hidden_stride + c[None, :],
                 rows.to(o_hidden_ptr.dtype.element_ty), mask=in_query[:, None] & in_h[None, :])

    pad = QUERY_LEN - length
    seq = tl.load(seq_ptr + req, mask=real, other=0).to(tl.int64) + pad
    tl.store(o_seq_ptr + req, seq)
    rej = pad - 1 + real.to(tl.int64)  # filler: query_len - 1
    if HAS_REJ:
        rej += tl.load(rej_ptr + req, mask=real, other=0).to(tl.int64)
    tl.store(o_rej_ptr + req, rej)
    if HAS_TIS:
        sample = tl.load(tis_ptr + req, mask=real, other=0).to(tl.int64) - start
    else:
        sample = length - 1
    tl.store(o_tis_ptr + req, req.to(tl.int64) * QUERY_LEN + tl.where(real, sample, 0))
    tl.store(o_next_ptr + req, tl.load(next_ptr + req, mask=real, other=0))

    w = tl.arange(0, BLOCK_W)
    for b in range(0, width_out, BLOCK_W):
        col = b + w
        blocks = tl.load(bt_ptr + req.to(tl.int64) * bt_stride + col,
                         mask=real & (col < width_in), other=0)
        tl.store(o_bt_ptr + req.to(tl.int64) * o_bt_stride + col, blocks, mask=col < width_out)


def pad_drafter_batch(target_token_ids, target_positions, target_hidden_states, next_token_ids,
                      token_indices_to_sample, num_rejected_tokens, query_start_loc, seq_lens,
                      block_table, slot_mapping, out_token_ids, out_positions, out_hidden_states,
                      out_next_token_ids, out_token_indices_to_sample, out_num_rejected,
                      out_seq_lens, out_block_table, out_slot_mapping, query_len: int,
                      fake_position: int) -> None:
    check_pad_drafter_batch(target_token_ids, target_positions, target_hidden_states,
                            next_token_ids, token_indices_to_sample, num_rejected_tokens,
                            query_start_loc, seq_lens, block_table, slot_mapping, out_token_ids,
                            out_positions, out_hidden_states, out_next_token_ids,
                            out_token_indices_to_sample, out_num_rejected, out_seq_lens,
                            out_block_table, out_slot_mapping, query_len, fake_position)
    padded = out_next_token_ids.shape[0]
    if padded == 0:
        return
    # Absent optional inputs: any tensor stands in for the pointer; the flag skips the load.
    tis = next_token_ids if token_indices_to_sample is None else token_indices_to_sample
    rej = next_token_ids if num_rejected_tokens is None else num_rejected_tokens
    _pad_drafter_batch_kernel[(padded,)](
        target_token_ids, target_positions, target_hidden_states,
        target_hidden_states.stride(0), next_token_ids, tis, rej, query_start_loc, seq_lens,
        block_table, block_table.stride(0), slot_mapping,
        out_token_ids, out_positions, out_hidden_states, out_hidden_states.stride(0),
        out_next_token_ids, out_token_indices_to_sample, out_num_rejected, out_seq_lens,
        out_block_table, out_block_table.stride(0), out_slot_mapping,
        next_token_ids.shape[0], target_hidden_states.shape[1], block_table.shape[1],
        out_block_table.shape[1], fake_position,
        QUERY_LEN=query_len, Q_BLOCK=triton.next_power_of_2(query_len),
        HAS_TIS=token_indices_to_sample is not None, HAS_REJ=num_rejected_tokens is not None,
        BLOCK_H=_BLOCK_H, BLOCK_W=_BLOCK_W,
    )
