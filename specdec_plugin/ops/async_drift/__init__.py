"""Correct each request's computed-token count on the device under async speculative decoding.

Why: vLLM's runner (``GPUModelRunner._prepare_inputs``) makes this correction every step under
async speculative decoding with ``update_num_computed_tokens_for_batch_change``
(v1/spec_decode/utils.py), a function under ``torch.compile(dynamic=True)``. Dynamo
specialises sizes 0 and 1, so the first step that follows a batch of one request, or that
holds one request after a larger batch, compiles the function again while serving: 0.3-1.0 s
that step waits (H100, session 27: EAGLE-3 timed runs of 1.72 and 1.76 s against 0.93-1.02 s,
the stall inside one ``execute_model`` call of the step after a one-request step). Which steps
meet those sizes depends on when requests arrive, so the warm-up cannot reach them all. Patch
P14 puts this op in its place.

What (vLLM's semantics, exactly): for each row ``i < n`` of the current batch, ``prev_positions[i]``
is the request's row in the previous batch, or -1 for a request that was not in it. A request
that was in it and drafted there (``prev_num_draft_tokens[p] > 0``) gets
``num_computed_tokens[i] = num_computed_tokens[p] + valid_sampled_token_count[p]`` and
``num_accepted_tokens[i] = valid_sampled_token_count[p]``; any other request gets
``num_computed_tokens[i] = cpu_num_computed_tokens[i]`` and keeps its ``num_accepted_tokens[i]``.
Every read sees the values from before the call (rows are permuted between batches, so row
``i`` may read the old value of a row another request overwrites).

Shapes: ``num_computed_tokens`` ``[>= n]`` int32 (updated in place), ``num_accepted_tokens``
``[n]`` int32 (in place), ``prev_positions`` ``[n]`` int64, ``valid_sampled_token_count``
``[P]`` (the previous batch), ``prev_num_draft_tokens`` ``[>= P]`` int32,
``cpu_num_computed_tokens`` ``[n]`` int32, all on one device.

Providers: ``reference.py`` (torch, vLLM's function without ``torch.compile``), ``triton.py``
(one program: every row read into a scratch row first, then written, so no read sees a new value).
"""
