"""Drop-in replacements for vLLM 0.26's spec-decode input-preparation and slot-mapping kernels.

Each adapter takes the exact arguments vLLM launches the kernel with (vLLM's parameter names, so
keyword launches bind; constexpr block sizes and launch options are ignored), recovers what
vLLM encodes in the grid (number of requests, padded batch size) and calls our kernel through
the registry. ``shim_table(providers)`` maps ``(vllm module, symbol)`` -> shim; the EAGLE kernels
are imported by name into ``llm_base_proposer``, so they appear under it as well as under
``spec_decode.utils``. DFlash's kernel is not shimmed: the config checks refuse DFlash.
"""
from __future__ import annotations

from specdec_plugin.ops.registry import get_kernel
from specdec_plugin.ops.spec_prep.kernel_shim import VllmKernelShim, rows_with_stride

_UTILS = "vllm.v1.spec_decode.utils"
_PROPOSER = "vllm.v1.spec_decode.llm_base_proposer"
_BLOCK_TABLE = "vllm.v1.worker.block_table"


def _slot_mapping_adapter(providers):
    def launch(
        grid, num_tokens, max_num_tokens, query_start_loc_ptr, positions_ptr, block_table_ptr,
        block_table_stride, block_size, slot_mapping_ptr, KV_CACHE_BLOCK_SIZE=None,
        BLOCKS_PER_KV_BLOCK=1, TOTAL_CP_WORLD_SIZE=1, TOTAL_CP_RANK=0,
        CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1, BLOCK_SIZE=None, **_launch_options,
    ):
        # One program per request plus a last one that pads: the request count is grid[0] - 1.
        get_kernel("compute_slot_mapping", providers)(
            slot_mapping_ptr, query_start_loc_ptr, positions_ptr,
            rows_with_stride(block_table_ptr, block_table_stride), block_size, grid[0] - 1,
            int(num_tokens), int(max_num_tokens), PAD_ID, KV_CACHE_BLOCK_SIZE,
            BLOCKS_PER_KV_BLOCK, TOTAL_CP_WORLD_SIZE, TOTAL_CP_RANK, CP_KV_CACHE_INTERLEAVE_SIZE,
        )
    return launch


def _eagle_step_adapter(providers):
    def launch(
        grid, positions_ptr, block_table_ptr, block_table_stride, seq_lens_ptr,
        out_clamped_positions_ptr, out_slot_mapping_ptr, block_size, max_model_len,
        n_blocks_per_req, PAD_ID, batch_size, **_launch_options,
    ):
        # One program per padded row: rows >= batch_size are graph padding.
        table = rows_with_stride(block_table_ptr, block_table_stride)[:, :n_blocks_per_req]
        get_kernel("eagle_step_slot_mapping_metadata", providers)(
            positions_ptr, table, seq_lens_ptr, out_clamped_positions_ptr, out_slot_mapping_ptr,
            block_size, max_model_len, int(batch_size), grid[0], PAD_ID,
        )
    return launch


def _prepare_inputs_padded_adapter(providers):
    def launch(
        grid, cu_num_draft_tokens_ptr, valid_sampled_tokens_count_ptr, query_start_loc_gpu_ptr,
        token_indices_to_sample_ptr, num_rejected_tokens_gpu_ptr, num_reqs, **_launch_options,
    ):
        get_kernel("eagle_prepare_inputs_padded", providers)(
            cu_num_draft_tokens_ptr, valid_sampled_tokens_count_ptr, query_start_loc_gpu_ptr,
            token_indices_to_sample_ptr, num_rejected_tokens_gpu_ptr,
            min(int(num_reqs), grid[0]),
        )
    return launch


def _next_token_padded_adapter(providers):
    def launch(
        grid, sampled_token_ids_ptr, discard_request_mask_ptr, backup_next_token_ids_ptr,
        next_token_ids_ptr, valid_sampled_tokens_count_ptr, vocab_size,
        num_sampled_tokens_per_req, num_reqs, stride_sampled_token_ids,
        BLOCK_SIZE_TOKENS=None, **_launch_options,
    ):
        get_kernel("eagle_prepare_next_token_padded", providers)(
            rows_with_stride(sampled_token_ids_ptr, stride_sampled_token_ids),
            discard_request_mask_ptr, backup_next_token_ids_ptr, next_token_ids_ptr,
            valid_sampled_tokens_count_ptr, int(vocab_size), int(num_sampled_tokens_per_req),
            min(int(num_reqs), grid[0]),
        )
    return launch


def _eagle_expand_adapter(providers):
    def launch(
        grid, target_token_ids_ptr, target_positions_ptr, next_token_ids_ptr, out_input_ids_ptr,
        out_positions_ptr, out_is_rejected_token_mask_ptr, out_is_masked_token_mask_ptr,
        out_new_token_indices_ptr, out_hidden_state_mapping_ptr, query_start_loc_ptr,
        query_end_loc_ptr, padding_token_id, parallel_drafting_token_id, total_input_tokens,
        num_padding_slots_per_request, shift_input_ids, BLOCK_SIZE_TOKENS=None,
        **_launch_options,
    ):
        # vLLM: "we can deduce batch_size for free from the grid size".
        get_kernel("copy_and_expand_eagle_inputs", providers)(
            target_token_ids_ptr, target_positions_ptr, next_token_ids_ptr, out_input_ids_ptr,
            out_positions_ptr, out_is_rejected_token_mask_ptr, out_is_masked_token_mask_ptr,
            out_new_token_indices_ptr, out_hidden_state_mapping_ptr, query_start_loc_ptr,
            query_end_loc_ptr, int(padding_token_id), int(parallel_drafting_token_id),
            int(total_input_tokens), int(num_padding_slots_per_request), bool(shift_input_ids),
            grid[0],
        )
    return launch


_TABLE = {
    (_BLOCK_TABLE, "_compute_slot_mapping_kernel"): _slot_mapping_adapter,
    (_UTILS, "eagle_step_slot_mapping_metadata_kernel"): _eagle_step_adapter,
    (_UTILS, "eagle_prepare_inputs_padded_kernel"): _prepare_inputs_padded_adapter,
    (_PROPOSER, "eagle_prepare_inputs_padded_kernel"): _prepare_inputs_padded_adapter,
    (_UTILS, "eagle_prepare_next_token_padded_kernel"): _next_token_padded_adapter,
    (_PROPOSER, "eagle_prepare_next_token_padded_kernel"): _next_token_padded_adapter,
    (_UTILS, "copy_and_expand_eagle_inputs_kernel"): _eagle_expand_adapter,
    (_PROPOSER, "copy_and_expand_eagle_inputs_kernel"): _eagle_expand_adapter,
}


def shim_table(providers: tuple[str, ...] = ("torch",)) -> dict[tuple[str, str], VllmKernelShim]:
    """``{(vllm module path, symbol): shim}`` for every input-preparation Triton kernel."""
    return {
        (module, symbol): VllmKernelShim(make(tuple(providers)), symbol)
        for (module, symbol), make in _TABLE.items()
    }
