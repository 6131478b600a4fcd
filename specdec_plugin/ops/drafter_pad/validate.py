"""The drafter-batch padding contract (package docstring), run first by every provider."""
from __future__ import annotations

import torch

from specdec_plugin.ops.contract import INDEX_DTYPES, fail, same_device

OP = "pad_drafter_batch"


def check_pad_drafter_batch(target_token_ids, target_positions, target_hidden_states,
                            next_token_ids, token_indices_to_sample, num_rejected_tokens,
                            query_start_loc, seq_lens, block_table, slot_mapping,
                            out_token_ids, out_positions, out_hidden_states, out_next_token_ids,
                            out_token_indices_to_sample, out_num_rejected, out_seq_lens,
                            out_block_table, out_slot_mapping, query_len: int,
                            fake_position: int) -> None:
    num_tokens = target_token_ids.shape[0] if target_token_ids.dim() == 1 else -1
    num_reqs = next_token_ids.shape[0] if next_token_ids.dim() == 1 else -1
    if num_tokens < 0 or target_positions.shape != (num_tokens,):
        fail(OP, f"target_token_ids and target_positions must be 1-D of one length, got "
                 f"{tuple(target_token_ids.shape)} and {tuple(target_positions.shape)}")
    if target_hidden_states.dim() != 2 or target_hidden_states.shape[0] != num_tokens:
        fail(OP, f"target_hidden_states must be [{num_tokens}, hidden], got "
                 f"{tuple(target_hidden_states.shape)}")
    if num_reqs < 0 or query_start_loc.shape != (num_reqs + 1,) or seq_lens.shape != (num_reqs,):
        fail(OP, f"next_token_ids [B], query_start_loc [B+1], seq_lens [B] disagree: "
                 f"{tuple(next_token_ids.shape)}, {tuple(query_start_loc.shape)}, "
                 f"{tuple(seq_lens.shape)}")
    for name, t in (("token_indices_to_sample", token_indices_to_sample),
                    ("num_rejected_tokens", num_rejected_tokens)):
        if t is not None and t.shape != (num_reqs,):
            fail(OP, f"{name} must be [{num_reqs}] or None, got {tuple(t.shape)}")
    if block_table.dim() != 2 or block_table.shape[0] < num_reqs:
        fail(OP, f"block_table must be [>= {num_reqs}, blocks], got {tuple(block_table.shape)}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] < num_tokens:
        fail(OP, f"slot_mapping must be 1-D with >= {num_tokens} entries, got "
                 f"{tuple(slot_mapping.shape)}")
    for name, t in (("target_token_ids", target_token_ids), ("query_start_loc", query_start_loc),
                    ("seq_lens", seq_lens), ("block_table", block_table),
                    ("slot_mapping", slot_mapping)):
        if t.dtype not in INDEX_DTYPES:
            fail(OP, f"{name} must be int32/int64, got {t.dtype}")
    if query_len < 1 or fake_position < 0:
        fail(OP, f"query_len must be >= 1 and fake_position >= 0, got {query_len}, {fake_position}")
    padded = out_next_token_ids.shape[0] if out_next_token_ids.dim() == 1 else -1
    if padded < num_reqs:
        fail(OP, f"out_next_token_ids must be [P] with P >= {num_reqs}, got "
                 f"{tuple(out_next_token_ids.shape)}")
    rows = padded * query_len
    for name, t, shape in (("out_token_ids", out_token_ids, (rows,)),
                           ("out_positions", out_positions, (rows,)),
                           ("out_slot_mapping", out_slot_mapping, (rows,)),
                           ("out_hidden_states", out_hidden_states,
                            (rows, target_hidden_states.shape[1])),
                           ("out_token_indices_to_sample", out_token_indices_to_sample, (padded,)),
                           ("out_num_rejected", out_num_rejected, (padded,)),
                           ("out_seq_lens", out_seq_lens, (padded,))):
        if tuple(t.shape) != shape:
            fail(OP, f"{name} must be {list(shape)}, got {list(t.shape)}")
        if not t.is_contiguous():
            fail(OP, f"{name} must be contiguous")
    if out_block_table.dim() != 2 or out_block_table.shape[0] != padded:
        fail(OP, f"out_block_table must be [{padded}, blocks], got {tuple(out_block_table.shape)}")
    if target_hidden_states.stride(-1) != 1 or out_block_table.stride(-1) != 1 \
            or block_table.stride(-1) != 1:
        fail(OP, "hidden states and block tables need contiguous rows")
    same_device(OP, target_token_ids, target_positions=target_positions,
                target_hidden_states=target_hidden_states, next_token_ids=next_token_ids,
                token_indices_to_sample=token_indices_to_sample,
                num_rejected_tokens=num_rejected_tokens, query_start_loc=query_start_loc,
                seq_lens=seq_lens, block_table=block_table, slot_mapping=slot_mapping,
                out_token_ids=out_token_ids, out_positions=out_positions,
                out_hidden_states=out_hidden_states, out_next_token_ids=out_next_token_ids,
                out_token_indices_to_sample=out_token_indices_to_sample,
                out_num_rejected=out_num_rejected, out_seq_lens=out_seq_lens,
                out_block_table=out_block_table, out_slot_mapping=out_slot_mapping)
