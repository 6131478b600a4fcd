"""Per-call cost of the host-side drafting indexes (C++ vs the pure-Python references).

    SPECDEC_JIT_BUILD=1 python benchmarks/bench_suffix_index.py [--context 4096]

Prints microseconds per add_tokens() token and per speculate() call of SuffixIndex on a
context of --context tokens (depth 24), and per-request ngram_propose_batch() time next to
vLLM's numba NgramProposer kernel on the same rows.
"""
from __future__ import annotations

import argparse
import random
import time

import numpy as np

from specdec_plugin.spec_decode.ngram_index import ngram_propose_batch
from specdec_plugin.spec_decode.suffix_index import SuffixIndex
from specdec_plugin.spec_decode.suffix_reference import ReferenceSuffixIndex, repetitive_token_stream




def _per_call(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def bench_suffix(context: int) -> None:
    rng = random.Random(0)
    tokens = repetitive_token_stream(rng, context + 256, 512)
    ctx = np.asarray(tokens[context - 24:context], dtype=np.int32)
    for name, cls, reps in (("cpp", SuffixIndex, 200), ("python-ref", ReferenceSuffixIndex, 10)):
        idx = cls(24, 100)
        t0 = time.perf_counter()
        idx.start_request("r", tokens[:context])
        t_start = (time.perf_counter() - t0) * 1e3
        new = iter(np.asarray(tokens[context:], dtype=np.int32).reshape(-1, 1))
        t_add = _per_call(lambda: idx.add_tokens("r", next(new)), min(reps, 256))
        t_spec = _per_call(lambda: idx.speculate("r", ctx, 8, 1.0, 0.1), reps * 10)
        print(f"suffix {name:10s}: start_request {t_start:8.1f} ms  add_tokens {t_add:8.1f} us/token"
              f"  speculate {t_spec:8.1f} us/call  (context {context}, depth 24)")


def bench_ngram(context: int, batch: int = 64) -> None:
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 512, size=(batch, context), dtype=np.int32)
    counts = np.full(batch, context, dtype=np.int32)
    rows = list(range(batch))
    _find_longest_matched_ngram_and_propose_tokens(tokens[0], 3, 5, 1 << 20, 8)  # JIT
    t_cpp = _per_call(lambda: ngram_propose_batch(tokens, counts, rows, 3, 5, 8, 1 << 20), 20)
    t_numba = _per_call(lambda: [_find_longest_matched_ngram_and_propose_tokens(
        tokens[r], 3, 5, 1 << 20, 8) for r in rows], 20)
    print(f"ngram batch of {batch} x {context} tokens: cpp {t_cpp / batch:.2f} us/request, "
          f"vLLM numba {t_numba / batch:.2f} us/request")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--context", type=int, default=4096)
    args = parser.parse_args()
    bench_suffix(args.context)
    bench_ngram(args.context)
