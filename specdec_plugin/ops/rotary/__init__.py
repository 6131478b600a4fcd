"""Rotary position embedding of query and key, in place (vLLM's ``RotaryEmbedding``).

``apply_rotary(positions, query, key, cos_sin_cache, head_size, rotary_dim, is_neox)``:
- ``positions`` ``[num_tokens]`` (any shape; flattened), integer;
- ``query`` ``[num_tokens, num_q_heads * head_size]`` or ``[num_tokens, num_q_heads, head_size]``;
  ``key`` the same with its own head count, or None. Either may be a strided view (e.g. a column
  slice of a fused qkv buffer) as long as ``view(num_tokens, -1, head_size)`` works and the last
  dimension is contiguous;
- ``cos_sin_cache`` ``[max_position, rotary_dim]``: cos of each frequency in the first half,
  sin in the second.
The first ``rotary_dim`` elements of every head are rotated, in place; the rest
(``rotary_dim < head_size``, partial rotary) are left untouched. Neox style pairs element ``i``
with ``i + rotary_dim / 2``; GPT-J style pairs ``2i`` with ``2i + 1``. Returns ``(query, key)``.

Numerics follow vLLM's ``forward_native`` in eager PyTorch: the cache is rounded to the query's
dtype, and each product and each sum is rounded to that dtype (a provider may fuse a product
into its sum, one rounding fewer).
"""
