"""The computed-token correction's contract (package docstring), run first by every provider."""
from __future__ import annotations

import torch

from specdec_plugin.ops.contract import INDEX_DTYPES, fail, same_device

OP = "correct_computed_tokens"
COUNT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def check_correct_computed_tokens(num_computed_tokens, num_accepted_tokens, prev_positions,
                                  valid_sampled_token_count, prev_num_draft_tokens,
                                  cpu_num_computed_tokens) -> int:
    """Returns ``n``, the rows of the current batch."""
    n = prev_positions.shape[0] if prev_positions.dim() == 1 else -1
    if n < 0 or num_accepted_tokens.shape != (n,) or cpu_num_computed_tokens.shape != (n,):
        fail(OP, f"prev_positions, num_accepted_tokens and cpu_num_computed_tokens must be "
                 f"[n], got {tuple(prev_positions.shape)}, {tuple(num_accepted_tokens.shape)}, "
                 f"{tuple(cpu_num_computed_tokens.shape)}")
    if num_computed_tokens.dim() != 1 or num_computed_tokens.shape[0] < n:
        fail(OP, f"num_computed_tokens must be 1-D with >= {n} rows, got "
                 f"{tuple(num_computed_tokens.shape)}")
    if valid_sampled_token_count.dim() != 1:
        fail(OP, f"valid_sampled_token_count must be 1-D, got "
                 f"{tuple(valid_sampled_token_count.shape)}")
    if (prev_num_draft_tokens.dim() != 1
            or prev_num_draft_tokens.shape[0] < valid_sampled_token_count.shape[0]):
        fail(OP, f"prev_num_draft_tokens must be 1-D and cover the previous batch's "
                 f"{valid_sampled_token_count.shape[0]} rows, got "
                 f"{tuple(prev_num_draft_tokens.shape)}")
    for name, t in (("num_computed_tokens", num_computed_tokens),
                    ("num_accepted_tokens", num_accepted_tokens),
                    ("prev_positions", prev_positions),
                    ("valid_sampled_token_count", valid_sampled_token_count),
                    ("prev_num_draft_tokens", prev_num_draft_tokens),
                    ("cpu_num_computed_tokens", cpu_num_computed_tokens)):
        # The counts may come in any integer type (vLLM's function casts them); the buffers
        # the runner owns are int32 / int64.
        counts = name in ("valid_sampled_token_count", "prev_num_draft_tokens")
        if t.dtype not in (COUNT_DTYPES if counts else INDEX_DTYPES):
            fail(OP, f"{name} must be {'an integer type' if counts else 'int32 or int64'}, "
                     f"got {t.dtype}")
        if t.dim() == 1 and t.shape[0] > 1 and t.stride(0) != 1:
            fail(OP, f"{name} must be contiguous")
    same_device(OP, prev_positions, num_computed_tokens=num_computed_tokens,
                num_accepted_tokens=num_accepted_tokens,
                valid_sampled_token_count=valid_sampled_token_count,
                prev_num_draft_tokens=prev_num_draft_tokens,
                cpu_num_computed_tokens=cpu_num_computed_tokens)
    return n
