"""Input preparation for speculative decoding: KV slot mapping and EAGLE/MTP drafter inputs.

Same semantics as vLLM 0.26's Triton kernels ``_compute_slot_mapping_kernel``
(``vllm/v1/worker/block_table.py``) and ``eagle_step_slot_mapping_metadata_kernel``,
``eagle_prepare_inputs_padded_kernel``, ``eagle_prepare_next_token_padded_kernel``,
``copy_and_expand_eagle_inputs_kernel``
(``vllm/v1/spec_decode/utils.py``). Every op writes into caller-owned buffers (vLLM's persistent
runner buffers) and returns nothing useful; none of them syncs with the host.

Conventions shared by every provider:
- ``query_start_loc`` ``[num_reqs + 1]`` int32 (exclusive prefix sums of query lengths);
- ``cu_num_draft_tokens`` ``[num_reqs]`` int32, INCLUSIVE prefix sums of draft counts;
- ``block_table`` ``[rows >= num_reqs, max_blocks]`` int32, row i = request i;
- slot ids: ``block_id * block_size + offset``, ``pad_id`` (-1) for "do not write the KV cache";
- ``positions`` int64; slot mappings int64.

Ops (see each function's docstring for the exact contract):
- ``compute_slot_mapping``: per-token KV slot from positions and the block table, with hybrid
  kernel blocks and decode context parallelism; pads ``[num_tokens, max_num_tokens)``.
- ``eagle_step_slot_mapping_metadata``: one autoregressive drafting step (position + 1, slot, seq
  len + 1, clamped at ``max_model_len``).
- ``eagle_prepare_inputs_padded``: token index to sample and rejected count per request.
- ``eagle_prepare_next_token_padded``: last valid sampled token per request and how many.
- ``copy_and_expand_eagle_inputs``: parallel-drafting input layout (shift, bonus, extra slots).
"""
