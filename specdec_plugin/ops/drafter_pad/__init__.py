"""Pad a drafter's batch to a fixed shape, so one recorded graph serves every batch up to it.

Why: our drafter graphs (``spec_decode/drafter_graphs.py``) replay vLLM's ``propose``, whose
launches depend on the number of requests and of target tokens. Keyed by the exact shape, a
server sees a new key at almost every step size and records it on the spot, inside the
request that met it. Padded to ``padded_reqs`` requests of exactly ``query_len`` tokens each,
the key is only (K, padded_reqs), and every key can be recorded at engine start.

The layout (EAGLE, EAGLE-3, MTP inputs as vLLM's padded drafter batch passes them):
- real request ``i < num_reqs`` keeps its ``q_i`` target tokens, moved to slots
  ``i*query_len .. i*query_len+q_i-1``; the ``pad_i = query_len - q_i`` slots after them are
  filler tokens (id 0, hidden state 0, KV slot -1: nothing is written to the cache, positions
  continuing the request's, capped at ``fake_position``). Its sequence length and its count of
  rejected tokens both grow by ``pad_i``: the real tokens keep their positions (a query's
  tokens are the last of its sequence), the fillers come after them, and vLLM's later draft
  steps subtract the rejected count again, so they see the unpadded length. The token to sample
  keeps pointing at the same token; the next token and the block table row are copied.
- filler request ``i >= num_reqs``: ``query_len`` filler tokens at ``fake_position``
  (``max_model_len - 1``; one lower for the draft model, spec_decode/drafter_padding.py),
  sequence length ``query_len``, rejected ``query_len - 1``, sampling its first token, next token 0,
  block table row all 0 (vLLM's null block, never handed to a request). Its drafts are dropped.

Shapes: ``target_token_ids``/``target_positions`` ``[T]``, ``target_hidden_states`` ``[T, H]``,
``next_token_ids`` ``[B]``, ``token_indices_to_sample`` ``[B]`` or None (the last token of
each request), ``num_rejected_tokens`` ``[B]`` or None (none rejected), ``query_start_loc``
``[B+1]``, ``seq_lens`` ``[B]``, ``block_table`` ``[B, W_in]``, ``slot_mapping`` ``[>= T]``. The
outputs are written in place: ``out_token_ids``, ``out_positions``, ``out_slot_mapping``
``[P*query_len]``, ``out_hidden_states`` ``[P*query_len, H]``, ``out_next_token_ids``,
``out_token_indices_to_sample``, ``out_num_rejected``, ``out_seq_lens`` ``[P]`` and
``out_block_table`` ``[P, W_out]`` (columns past ``W_in`` are 0; ``W_out`` is enough for
``max_model_len``), with ``P >= B`` and every ``q_i`` in ``[1, query_len]`` (the caller checks
the latter on the host from ``max_query_len``). Values are cast to each output's dtype.

Providers: ``reference.py`` (torch, no host sync), ``triton.py`` (one program per padded
request).
"""
