"""The spec-decode input-preparation contract (package docstring), one check per op, run first by
every provider of that op. Every op writes into caller-owned buffers, so the checks are mostly
that each buffer holds the rows the integer arguments say will be read or written."""
from __future__ import annotations

import torch

from specdec_plugin.ops.contract import fail, same_device


def _rows(op: str, need: int, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.shape[0] < need:
            fail(op, f"{name} has {t.shape[0]} rows, {need} are addressed")


def check_compute_slot_mapping(slot_mapping, query_start_loc, positions, block_table,
                               block_size, num_reqs, num_tokens, max_num_tokens,
                               blocks_per_kv_block, cp_world_size, cp_rank) -> None:
    op = "compute_slot_mapping"
    if min(num_reqs, num_tokens) < 0 or num_tokens > max_num_tokens or block_size <= 0 \
            or blocks_per_kv_block <= 0 or not 0 <= cp_rank < cp_world_size:
        fail(op, f"bad sizes: num_reqs {num_reqs}, num_tokens {num_tokens} <= max_num_tokens "
                 f"{max_num_tokens}, block_size {block_size}, blocks_per_kv_block "
                 f"{blocks_per_kv_block}, cp rank {cp_rank} of {cp_world_size}")
    if block_table.dim() != 2:
        fail(op, f"block_table must be 2-D, got {tuple(block_table.shape)}")
    _rows(op, max_num_tokens, slot_mapping=slot_mapping)
    _rows(op, num_tokens, positions=positions)
    _rows(op, num_reqs + 1, query_start_loc=query_start_loc)
    _rows(op, num_reqs, block_table=block_table)
    same_device(op, slot_mapping, query_start_loc=query_start_loc, positions=positions,
                block_table=block_table)


def check_eagle_step_slot_mapping_metadata(positions, block_table, seq_lens,
                                           out_clamped_positions, out_slot_mapping, block_size,
                                           batch_size, input_batch_size) -> None:
    op = "eagle_step_slot_mapping_metadata"
    if min(batch_size, input_batch_size) < 0 or block_size <= 0 or block_table.dim() != 2:
        fail(op, f"bad sizes: batch_size {batch_size}, input_batch_size {input_batch_size}, "
                 f"block_size {block_size}, block_table {tuple(block_table.shape)}")
    _rows(op, batch_size, positions=positions, block_table=block_table, seq_lens=seq_lens,
          out_clamped_positions=out_clamped_positions)
    _rows(op, max(batch_size, input_batch_size), out_slot_mapping=out_slot_mapping)
    same_device(op, positions, block_table=block_table, seq_lens=seq_lens,
                out_clamped_positions=out_clamped_positions, out_slot_mapping=out_slot_mapping)


def check_eagle_prepare_inputs_padded(cu_num_draft_tokens, valid_sampled_tokens_count,
                                      query_start_loc, token_indices_to_sample,
                                      num_rejected_tokens, num_reqs) -> None:
    op = "eagle_prepare_inputs_padded"
    if num_reqs < 0:
        fail(op, f"num_reqs {num_reqs} < 0")
    _rows(op, num_reqs, cu_num_draft_tokens=cu_num_draft_tokens,
          valid_sampled_tokens_count=valid_sampled_tokens_count,
          token_indices_to_sample=token_indices_to_sample,
          num_rejected_tokens=num_rejected_tokens)
    _rows(op, num_reqs + 1, query_start_loc=query_start_loc)
    same_device(op, query_start_loc, cu_num_draft_tokens=cu_num_draft_tokens,
                valid_sampled_tokens_count=valid_sampled_tokens_count,
                token_indices_to_sample=token_indices_to_sample,
                num_rejected_tokens=num_rejected_tokens)


def check_eagle_prepare_next_token_padded(sampled_token_ids, discard_request_mask,
                                          backup_next_token_ids, next_token_ids,
                                          valid_sampled_tokens_count,
                                          num_sampled_tokens_per_req, num_reqs) -> None:
    op = "eagle_prepare_next_token_padded"
    if num_reqs < 0 or sampled_token_ids.dim() != 2 \
            or not 0 <= num_sampled_tokens_per_req <= sampled_token_ids.shape[1]:
        fail(op, f"sampled_token_ids {tuple(sampled_token_ids.shape)} must be 2-D with at "
                 f"least {num_sampled_tokens_per_req} columns (num_reqs {num_reqs})")
    _rows(op, num_reqs, sampled_token_ids=sampled_token_ids,
          discard_request_mask=discard_request_mask, backup_next_token_ids=backup_next_token_ids,
          next_token_ids=next_token_ids, valid_sampled_tokens_count=valid_sampled_tokens_count)
    same_device(op, sampled_token_ids, discard_request_mask=discard_request_mask,
                backup_next_token_ids=backup_next_token_ids, next_token_ids=next_token_ids,
                valid_sampled_tokens_count=valid_sampled_tokens_count)


def check_copy_and_expand_eagle_inputs(target_token_ids, target_positions, next_token_ids,
                                       out_input_ids, out_positions, out_is_rejected_token_mask,
                                       out_is_masked_token_mask, out_new_token_indices,
                                       out_hidden_state_mapping, query_start_loc, query_end_loc,
                                       total_input_tokens, num_padding_slots_per_request,
                                       num_reqs) -> None:
    op = "copy_and_expand_eagle_inputs"
    if min(num_reqs, total_input_tokens) < 0 or num_padding_slots_per_request < 1:
        fail(op, f"bad sizes: num_reqs {num_reqs}, total_input_tokens {total_input_tokens}, "
                 f"num_padding_slots_per_request {num_padding_slots_per_request} (>= 1: the "
                 "bonus token's slot)")
    _rows(op, total_input_tokens, target_token_ids=target_token_ids,
          target_positions=target_positions)
    _rows(op, num_reqs, next_token_ids=next_token_ids, query_end_loc=query_end_loc)
    _rows(op, num_reqs + 1, query_start_loc=query_start_loc)
    _rows(op, num_reqs * num_padding_slots_per_request,
          out_new_token_indices=out_new_token_indices)
    same_device(op, query_start_loc, target_token_ids=target_token_ids,
                target_positions=target_positions, next_token_ids=next_token_ids,
                out_input_ids=out_input_ids, out_positions=out_positions,
                out_is_rejected_token_mask=out_is_rejected_token_mask,
                out_is_masked_token_mask=out_is_masked_token_mask,
                out_new_token_indices=out_new_token_indices,
                out_hidden_state_mapping=out_hidden_state_mapping, query_end_loc=query_end_loc)
