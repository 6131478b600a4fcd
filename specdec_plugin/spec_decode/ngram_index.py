"""Batched n-gram prompt lookup (C++, csrc/ngram_index.cpp) with vLLM 0.26 NgramProposer output.

For each listed row: the longest n in [min_n, max_n] whose last-n tokens occurred earlier in the
row (the earliest such occurrence on ties), drafting up to ``min(k, max_model_len - num_tokens)``
following tokens, fewer if the row ends first. Bit-for-bit the drafts of vLLM's numba
``_find_longest_matched_ngram_and_propose_tokens`` (tests/test_ngram_index.py checks it).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from specdec_plugin.spec_decode._native import load_extension


def ngram_propose_batch(
    token_ids_cpu: np.ndarray,
    num_tokens: np.ndarray | Sequence[int],
    rows: Sequence[int],
    min_n: int,
    max_n: int,
    k: int,
    max_model_len: int,
) -> list[list[int]]:
    """One draft (list of token ids, maybe empty) per entry of ``rows``, in that order.

    token_ids_cpu: int32 array [num_rows, row_len] (not copied; must already be int32).
    num_tokens: valid tokens per row (indexed by row number, any integer dtype).
    """
    return load_extension().ngram_propose_batch(
        token_ids_cpu, np.asarray(num_tokens), list(rows), min_n, max_n, k, max_model_len
    )


def ngram_propose_reference(
    tokens: np.ndarray, min_n: int, max_n: int, k: int, max_model_len: int
) -> list[int]:
    """Quadratic pure-Python statement of the same rule (for tests and documentation)."""
    n = len(tokens)
    if n == 0 or n < min_n or max_n <= 0:
        return []
    k = min(k, max_model_len - n)
    if k <= 0:
        return []
    toks = [int(t) for t in tokens]
    best_len, best_start = 0, n - 1  # best_start: first index of the earlier occurrence
    # Walk occurrence starts right to left so that an equal length at an earlier start wins.
    for s in range(n - 2, -1, -1):
        for length in range(min(max_n, n - 1 - s), 0, -1):
            if toks[s:s + length] == toks[n - length:]:
                if length >= best_len:
                    best_len, best_start = length, s
                break
    if best_len < min_n:
        return []
    start = best_start + best_len
    return toks[start:start + min(k, n - start)]
