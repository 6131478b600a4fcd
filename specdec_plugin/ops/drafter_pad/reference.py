"""Torch reference for padding a drafter's batch (package docstring); no host sync."""
from __future__ import annotations

import torch

from specdec_plugin.ops.drafter_pad.validate import check_pad_drafter_batch


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
    device, q_len = target_token_ids.device, query_len
    num_reqs, padded = next_token_ids.shape[0], out_next_token_ids.shape[0]
    # Every request starts as a filler; the real ones are overwritten below.
    out_token_ids.zero_()
    out_positions.fill_(fake_position)
    out_slot_mapping.fill_(-1)
    out_hidden_states.zero_()
    out_next_token_ids.zero_()
    out_seq_lens.fill_(q_len)
    out_num_rejected.fill_(q_len - 1)
    out_token_indices_to_sample.copy_(torch.arange(padded, device=device) * q_len)
    out_block_table.zero_()
    if num_reqs == 0:
        return
    qsl = query_start_loc.long()
    starts, ends = qsl[:-1], qsl[1:]
    lens = ends - starts  # [B], each in [1, query_len]
    pad = q_len - lens
    # Padded token r = (request i, offset j); the real ones read target token starts[i] + j.
    req = torch.arange(num_reqs, device=device).repeat_interleave(q_len)
    offset = torch.arange(q_len, device=device).repeat(num_reqs)
    is_token = offset < lens[req]
    src = torch.where(is_token, starts[req] + offset, 0).clamp(max=max(target_token_ids.shape[0] - 1, 0))
    rows = num_reqs * q_len
    out_token_ids[:rows] = torch.where(is_token, target_token_ids[src].long(), 0).to(out_token_ids.dtype)
    last_position = target_positions[(ends - 1).clamp(min=0)].long()[req]
    filler_position = (last_position + offset - lens[req] + 1).clamp(max=fake_position)
    out_positions[:rows] = torch.where(is_token, target_positions[src].long(),
                                       filler_position).to(out_positions.dtype)
    out_slot_mapping[:rows] = torch.where(is_token, slot_mapping[src].long(), -1).to(out_slot_mapping.dtype)
    out_hidden_states[:rows] = torch.where(is_token[:, None], target_hidden_states[src], 0).to(
        out_hidden_states.dtype)
    out_next_token_ids[:num_reqs] = next_token_ids.to(out_next_token_ids.dtype)
    out_seq_lens[:num_reqs] = (seq_lens.long() + pad).to(out_seq_lens.dtype)
    rejected = pad if num_rejected_tokens is None else num_rejected_tokens.long() + pad
    out_num_rejected[:num_reqs] = rejected.to(out_num_rejected.dtype)
    sample = ends - 1 if token_indices_to_sample is None else token_indices_to_sample.long()
    out_token_indices_to_sample[:num_reqs] = (
        torch.arange(num_reqs, device=device) * q_len + sample - starts).to(out_token_indices_to_sample.dtype)
    width = min(block_table.shape[1], out_block_table.shape[1])
    out_block_table[:num_reqs, :width] = block_table[:num_reqs, :width].to(out_block_table.dtype)
