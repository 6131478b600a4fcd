"""The n-gram step update's contract (package docstring), run first by every provider."""
from __future__ import annotations

import torch

from specdec_plugin.ops.contract import INDEX_DTYPES, fail, same_device

OP = "ngram_step_update"


def check_ngram_step_update(sampled_token_ids: torch.Tensor, discard_mask: torch.Tensor,
                            token_ids: torch.Tensor, num_tokens: torch.Tensor,
                            vocab_size: int) -> int:
    """Returns ``B``, the rows of the batch."""
    if sampled_token_ids.dim() != 2 or sampled_token_ids.dtype not in INDEX_DTYPES:
        fail(OP, f"sampled_token_ids must be int32/int64 [batch, 1 + k], got "
                 f"{sampled_token_ids.dtype} {tuple(sampled_token_ids.shape)}")
    rows = sampled_token_ids.shape[0]
    if discard_mask.dim() != 1 or discard_mask.dtype != torch.bool or discard_mask.shape[0] < rows:
        fail(OP, f"discard_mask must be bool [>= {rows}], got {discard_mask.dtype} "
                 f"{tuple(discard_mask.shape)}")
    if (token_ids.dim() != 2 or token_ids.dtype not in INDEX_DTYPES or token_ids.shape[0] < rows
            or token_ids.shape[1] < 1):
        fail(OP, f"token_ids must be int32/int64 [>= {rows}, max_len >= 1], got "
                 f"{token_ids.dtype} {tuple(token_ids.shape)}")
    if token_ids.shape[1] > 1 and token_ids.stride(1) != 1:
        fail(OP, "token_ids rows must be contiguous (stride 1 along the history)")
    if num_tokens.dim() != 1 or num_tokens.dtype not in INDEX_DTYPES or num_tokens.shape[0] < rows:
        fail(OP, f"num_tokens must be int32/int64 [>= {rows}], got {num_tokens.dtype} "
                 f"{tuple(num_tokens.shape)}")
    if vocab_size < 1:
        fail(OP, f"vocab_size must be positive, got {vocab_size}")
    same_device(OP, sampled_token_ids, discard_mask=discard_mask, token_ids=token_ids,
                num_tokens=num_tokens)
    return rows
