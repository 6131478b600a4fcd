"""The n-gram match contract (package docstring), run first by every provider."""
from __future__ import annotations

import torch

from specdec_plugin.ops.contract import INDEX_DTYPES, fail, same_device, values_on_host

OP = "ngram_match"


def check_ngram_match(token_ids: torch.Tensor, num_tokens: torch.Tensor,
                      active: torch.Tensor | None, min_n: int, max_n: int, k: int,
                      max_model_len: int) -> None:
    if token_ids.dim() != 2 or token_ids.dtype not in INDEX_DTYPES:
        fail(OP, f"token_ids must be int32/int64 [batch, max_len], got {token_ids.dtype} "
                 f"{tuple(token_ids.shape)}")
    batch, max_len = token_ids.shape
    if max_len > 1 and token_ids.stride(1) != 1:
        fail(OP, "token_ids rows must be contiguous (stride 1 along the history)")
    if num_tokens.dim() != 1 or num_tokens.shape[0] != batch or num_tokens.dtype not in INDEX_DTYPES:
        fail(OP, f"num_tokens must be int32/int64 [{batch}], got {num_tokens.dtype} "
                 f"{tuple(num_tokens.shape)}")
    if active is not None and (active.dtype != torch.bool or active.shape != (batch,)):
        fail(OP, f"active must be bool [{batch}] or None, got {active.dtype} {tuple(active.shape)}")
    if not 1 <= min_n <= max_n or k < 0 or max_model_len < 0:
        fail(OP, f"need 1 <= min_n <= max_n, k >= 0 and max_model_len >= 0; got min_n {min_n}, "
                 f"max_n {max_n}, k {k}, max_model_len {max_model_len}")
    same_device(OP, token_ids, num_tokens=num_tokens, active=active)
    # Only where the counts are in host memory: on a device this read would be a sync.
    if batch and values_on_host(num_tokens):
        if bool(((num_tokens < 0) | (num_tokens > max_len)).any()):
            fail(OP, f"num_tokens must lie in [0, {max_len}] (the history's width)")
