"""Triton n-gram match; same signature and results as ``reference.py``.

One program per request. Lengths are tried from ``max_n`` down, so the first length that
matches is the answer and the shorter ones are skipped; for a length, the history is scanned
in tiles from the front and the scan stops at the first tile holding a match (the earliest
occurrence is in it). A tile compares ``l`` shifted loads against the suffix's ``l`` tokens.
``min_n``, ``max_n`` (an engine's settings) and the padded ``k`` are compile-time constants.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_plugin.ops.ngram_match.validate import check_ngram_match

_TILE = 512


@triton.jit
def _ngram_match_kernel(
    tokens_ptr, tokens_stride, num_tokens_ptr, active_ptr, drafts_ptr, drafts_stride,
    count_ptr, k, max_model_len, max_len,
    HAS_ACTIVE: tl.constexpr, MIN_N: tl.constexpr, MAX_N: tl.constexpr,
    K_BLOCK: tl.constexpr, TILE: tl.constexpr,
):
    req = tl.program_id(0)
    row = tokens_ptr + req.to(tl.int64) * tokens_stride
    n = tl.load(num_tokens_ptr + req).to(tl.int64)
    n = tl.minimum(tl.maximum(n, 0), max_len)
    if HAS_ACTIVE:
        n = tl.where(tl.load(active_ptr + req) != 0, n, 0)
    zero = n * 0
    best_len = zero
    best_start = zero
    offsets = tl.arange(0, TILE).to(tl.int64)
    for length in tl.static_range(MAX_N, MIN_N - 1, -1):
        if best_len == 0:
            last_start = n - 1 - length  # at least one token must follow the occurrence
            first = zero + max_len  # max_len: no match yet
            tile = zero
            while (tile <= last_start) & (first == max_len):
                starts = tile + offsets
                match = starts <= last_start
                for i in tl.static_range(length):
                    want = tl.load(row + n - length + i)
                    got = tl.load(row + starts + i, mask=match, other=-1)
                    match = match & (got == want)
                first = tl.min(tl.where(match, starts, max_len), axis=0)
                tile += TILE
            best_len = tl.where(first < max_len, zero + length, best_len)
            best_start = tl.where(first < max_len, first, best_start)
    begin = best_start + best_len
    count = tl.minimum(n - begin, tl.minimum(max_model_len - n, k))
    count = tl.where(best_len > 0, tl.maximum(count, 0), 0)
    cols = tl.arange(0, K_BLOCK)
    taken = tl.load(row + begin + cols, mask=cols < count, other=-1)
    tl.store(drafts_ptr + req.to(tl.int64) * drafts_stride + cols, taken.to(tl.int32),
             mask=cols < k)
    tl.store(count_ptr + req, count.to(tl.int32))


def ngram_match(token_ids: torch.Tensor, num_tokens: torch.Tensor, active: torch.Tensor | None,
                min_n: int, max_n: int, k: int, max_model_len: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    check_ngram_match(token_ids, num_tokens, active, min_n, max_n, k, max_model_len)
    batch, max_len = token_ids.shape
    device = token_ids.device
    drafts = torch.empty((batch, k), dtype=torch.int32, device=device)
    count = torch.empty(batch, dtype=torch.int32, device=device)
    if batch == 0 or k == 0 or max_len == 0:
        drafts.fill_(-1)
        count.zero_()
        return drafts, count
    _ngram_match_kernel[(batch,)](
        token_ids, token_ids.stride(0), num_tokens,
        active if active is not None else num_tokens,  # never read without HAS_ACTIVE
        drafts, drafts.stride(0), count, k, max_model_len, max_len,
        HAS_ACTIVE=active is not None, MIN_N=min_n, MAX_N=max_n,
        K_BLOCK=triton.next_power_of_2(k), TILE=_TILE,
    )
    return drafts, count
