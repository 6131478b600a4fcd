"""Pure-torch n-gram match: the contract for every other provider, and the kernel the CPU runs
when the device n-gram path is forced there (tests).

Batched over requests with no host sync: for each length ``l`` (a handful, ``min_n..max_n``),
one boolean ``[batch, max_len]`` mask of the starts ``s`` whose ``l`` tokens equal the row's
last ``l``, built from ``l`` shifted comparisons; its earliest set column is the occurrence.
Lengths are tried from short to long, so a longer one that matches overrides a shorter one.
"""
from __future__ import annotations

import torch

from specdec_plugin.ops.ngram_match.validate import check_ngram_match


def ngram_match(token_ids: torch.Tensor, num_tokens: torch.Tensor, active: torch.Tensor | None,
                min_n: int, max_n: int, k: int, max_model_len: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    check_ngram_match(token_ids, num_tokens, active, min_n, max_n, k, max_model_len)
    batch, max_len = token_ids.shape
    device = token_ids.device
    drafts = torch.full((batch, k), -1, dtype=torch.int32, device=device)
    if batch == 0 or k == 0 or max_len == 0:
        return drafts, torch.zeros(batch, dtype=torch.int32, device=device)
    tokens = token_ids.long()
    n = num_tokens.long().clamp(0, max_len)
    if active is not None:
        n = torch.where(active, n, 0)  # an inactive row behaves as an empty history
    starts = torch.arange(max_len, device=device)
    best_len = torch.zeros(batch, dtype=torch.long, device=device)
    best_start = torch.zeros(batch, dtype=torch.long, device=device)
    for length in range(min_n, max_n + 1):
        # Starts that leave at least one token after the occurrence: s <= n - 1 - length.
        match = starts.unsqueeze(0) <= (n - 1 - length).unsqueeze(1)
        for i in range(length):
            # The suffix's i-th token (clamped index: rows too short are already all-False).
            want = tokens.gather(1, (n - length + i).clamp(0, max_len - 1).unsqueeze(1))
            same = torch.zeros_like(match)
            same[:, : max_len - i] = tokens[:, i:] == want
            match &= same
        found = match.any(dim=1)
        first = torch.where(match, starts.unsqueeze(0), max_len).amin(dim=1)
        best_len = torch.where(found, length, best_len)
        best_start = torch.where(found, first, best_start)
    begin = best_start + best_len
    count = torch.minimum(n - begin, (max_model_len - n).clamp(max=k))
    count = torch.where(best_len > 0, count.clamp(min=0), 0)
    cols = torch.arange(k, device=device)
    taken = tokens.gather(1, (begin.unsqueeze(1) + cols).clamp(max=max_len - 1))
    drafts = torch.where(cols < count.unsqueeze(1), taken, -1).to(torch.int32)
    return drafts, count.to(torch.int32)
