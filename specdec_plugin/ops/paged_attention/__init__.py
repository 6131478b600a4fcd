"""Attention of packed variable-length queries over a paged KV cache.

One op serves prefill, chunked prefill, decode and speculative verification (1+K query tokens
per request, causal among themselves): every query token attends to every cached token of its
request up to and including its own position.

Layout shared by every provider:
- query ``[num_tokens, num_q_heads, head_size]``, requests packed back to back;
- key_cache / value_cache ``[num_blocks, block_size, num_kv_heads, head_size]``;
- block_table ``[num_seqs, max_blocks_per_seq]`` int32, request i's logical block j lives in
  physical block ``block_table[i, j]``;
- query_start_loc ``[num_seqs + 1]`` int32 (cumulative query lengths), seq_lens ``[num_seqs]``
  int32 (tokens in the cache after this step, queries included).
The query tokens of request i are the last ``q_len_i`` tokens of its ``seq_len_i``; rows with
``q_len_i == 0`` (graph padding) are not read or written.

``paged_attention_write_kv`` first writes the K/V rows of the real query tokens (``key`` /
``value`` ``[num_tokens, num_kv_heads, head_size]``, the tokens of query_start_loc's ranges)
at their ``slot_mapping`` slots, as ``reshape_and_cache`` does (negative slots skipped), then
runs ``paged_attention``; the result is the two ops' in that order.
"""
