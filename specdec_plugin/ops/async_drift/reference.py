"""Torch reference of the computed-token correction (package docstring): vLLM's function body,
run eagerly. Every gather makes a new tensor before anything is written, so each read sees the
values from before the call."""
from __future__ import annotations

import torch

from specdec_plugin.ops.async_drift.validate import check_correct_computed_tokens


def correct_computed_tokens(num_computed_tokens: torch.Tensor, num_accepted_tokens: torch.Tensor,
                            prev_positions: torch.Tensor, valid_sampled_token_count: torch.Tensor,
                            prev_num_draft_tokens: torch.Tensor,
                            cpu_num_computed_tokens: torch.Tensor) -> None:
    n = check_correct_computed_tokens(num_computed_tokens, num_accepted_tokens, prev_positions,
                                      valid_sampled_token_count, prev_num_draft_tokens,
                                      cpu_num_computed_tokens)
    if n == 0:
        return
    prev = prev_positions.clamp(min=0)
    valid = valid_sampled_token_count[prev]
    drafted = prev_num_draft_tokens[prev] > 0
    corrected = num_computed_tokens[prev] + valid.to(num_computed_tokens.dtype)
    carried = (prev_positions >= 0) & drafted
    num_computed_tokens[:n].copy_(torch.where(
        carried, corrected, cpu_num_computed_tokens.to(num_computed_tokens.dtype)))
    num_accepted_tokens.copy_(torch.where(
        carried, valid.to(num_accepted_tokens.dtype), num_accepted_tokens))
