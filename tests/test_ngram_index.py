"""C++ n-gram prompt lookup (csrc/ngram_index.cpp) against vLLM 0.26's own numba implementation.

Our ngram proposer must produce vLLM's drafts exactly (acceptance rates are compared), so the
oracle is vllm.v1.spec_decode.ngram_proposer._find_longest_matched_ngram_and_propose_tokens.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("SPECDEC_JIT_BUILD", "1")

from specdec_plugin.spec_decode.ngram_index import (  # noqa: E402
    ngram_propose_batch,
    ngram_propose_reference,
)

ngram_proposer = pytest.importorskip("vllm.v1.spec_decode.ngram_proposer")
vllm_find = ngram_proposer._find_longest_matched_ngram_and_propose_tokens


def _random_rows(rng: np.random.Generator, num_rows: int, row_len: int, alphabet: int):
    tokens = rng.integers(0, alphabet, size=(num_rows, row_len), dtype=np.int32)
    for r in range(num_rows):  # paste earlier stretches so long n-grams recur
        for _ in range(rng.integers(0, 4)):
            src = rng.integers(0, row_len - 1)
            length = rng.integers(1, 10)
            dst = rng.integers(0, row_len - 1)
            piece = tokens[r, src:src + length].copy()
            tokens[r, dst:dst + len(piece)] = piece[: row_len - dst]
    return tokens


@pytest.mark.parametrize("alphabet", [2, 3, 5, 50])
@pytest.mark.parametrize("min_n,max_n", [(1, 1), (1, 3), (2, 5), (3, 3), (5, 5), (1, 8)])
def test_matches_vllm_numba(alphabet, min_n, max_n):
    rng = np.random.default_rng(alphabet * 100 + min_n * 10 + max_n)
    num_rows, row_len = 48, 64
    tokens = _random_rows(rng, num_rows, row_len, alphabet)
    num_tokens = rng.integers(0, row_len + 1, size=num_rows).astype(np.int32)
    rows = [int(r) for r in rng.permutation(num_rows)[:40]]
    for k, max_model_len in [(1, 1000), (4, 1000), (7, 1000), (5, 40)]:
        got = ngram_propose_batch(tokens, num_tokens, rows, min_n, max_n, k, max_model_len)
        assert len(got) == len(rows)
        nonempty = 0
        for r, draft in zip(rows, got):
            ctx = tokens[r, : num_tokens[r]]
            want = vllm_find(ctx, min_n, max_n, max_model_len, k).tolist()
            assert draft == want, (r, ctx.tolist(), min_n, max_n, k, max_model_len)
            assert draft == ngram_propose_reference(ctx, min_n, max_n, k, max_model_len)
            assert len(draft) <= k
            nonempty += bool(draft)
        if alphabet**min_n <= 32 and max_model_len == 1000:
            assert nonempty > 5  # the comparison is not vacuous


def test_leftmost_occurrence_and_longest_n():
    # [1 2 3] occurs at 0 (then 7) and at 4 (then 8); the suffix [1 2 3] is the longest match.
    seq = np.array([[1, 2, 3, 7, 1, 2, 3, 8, 5, 1, 2, 3]], dtype=np.int32)
    assert ngram_propose_batch(seq, [12], [0], 1, 4, 3, 100) == [[7, 1, 2]]
    # Capped at max_n=1: the last token 3 first appears at index 2.
    assert ngram_propose_batch(seq, [12], [0], 1, 1, 2, 100) == [[7, 1]]
    # min_n larger than any match: no draft; max_model_len reached: no draft.
    assert ngram_propose_batch(seq, [12], [0], 4, 5, 3, 100) == [[]]
    assert ngram_propose_batch(seq, [12], [0], 1, 4, 3, 12) == [[]]


def test_strided_rows_and_dtype_guard():
    rng = np.random.default_rng(0)
    base = _random_rows(rng, 8, 64, 3)
    view = base[:, ::2]  # non-contiguous rows take the copying path
    counts = np.full(8, 32, dtype=np.int64)
    got = ngram_propose_batch(view, counts, list(range(8)), 1, 4, 5, 1000)
    assert got == [vllm_find(np.ascontiguousarray(view[r]), 1, 4, 1000, 5).tolist()
                   for r in range(8)]
    with pytest.raises(TypeError):  # a silent int64 -> int32 copy of the whole buffer is refused
        ngram_propose_batch(base.astype(np.int64), counts, [0], 1, 4, 5, 1000)
