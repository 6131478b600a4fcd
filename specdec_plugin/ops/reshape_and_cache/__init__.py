"""Write new key/value rows into the paged KV cache at their slots; negative slots are padding.

Layout: key/value ``[num_tokens, num_kv_heads, head_size]``; key_cache/value_cache
``[num_blocks, block_size, num_kv_heads, head_size]``; slot_mapping ``[num_tokens]`` where slot
``s`` means block ``s // block_size``, offset ``s % block_size``. Only the first
``slot_mapping.numel()`` rows of key/value are read.
"""
