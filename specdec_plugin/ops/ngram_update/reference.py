"""Torch reference of the n-gram step update (package docstring): vLLM's
``update_token_ids_ngram`` body, then the history append, with no host sync."""
from __future__ import annotations

import torch

from specdec_plugin.ops.ngram_update.validate import check_ngram_step_update


def ngram_step_update(sampled_token_ids: torch.Tensor, discard_mask: torch.Tensor,
                      token_ids: torch.Tensor, num_tokens: torch.Tensor, vocab_size: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = check_ngram_step_update(sampled_token_ids, discard_mask, token_ids, num_tokens,
                                   vocab_size)
    width = token_ids.shape[1]
    history, counts = token_ids[:rows], num_tokens[:rows]
    # The history's last token, for rows with nothing sampled (vLLM's "backup").
    backup_at = (counts.long() - 1).clamp(0, width - 1).unsqueeze(1)
    backup = history.gather(1, backup_at).squeeze(1)
    valid = sampled_token_ids.masked_fill(discard_mask[:rows].unsqueeze(1), -1)
    valid_mask = (valid != -1) & (valid < vocab_size)
    count = valid_mask.sum(dim=1).to(torch.int32)
    last = (count.long() - 1).clamp(min=0).unsqueeze(1)
    selected = valid.gather(1, last).squeeze(1)
    next_token_ids = torch.where(count > 0, selected, backup)
    # The append, as one scatter over each row's columns n .. n + W - 1 (clamped into the row):
    # every entry writes the value its column ends with (a kept token, or the old value back),
    # taken from the entry that owns the column, so entries clamped onto the row's last column
    # agree with the one that is really there (no two entries of a row differ on a column).
    cols = torch.arange(valid.shape[1], device=valid.device)
    at = counts.long().unsqueeze(1) + cols
    keep = (cols < count.unsqueeze(1)) & (valid != -1) & (at < width)
    at = at.clamp(max=width - 1)
    owner = (at - counts.long().unsqueeze(1)).clamp(0, valid.shape[1] - 1)
    value = torch.where(keep.gather(1, owner), valid.gather(1, owner).to(history.dtype),
                        history.gather(1, at))
    history.scatter_(1, at, value)
    return next_token_ids, count, valid
