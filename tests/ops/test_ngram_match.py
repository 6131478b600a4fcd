"""N-gram match on the device (``ops/ngram_match``): the torch reference against our C++ index
(the host path, itself checked against vLLM's numba proposer in tests/test_ngram_index.py), and
every registered provider against the reference (Triton's on a GPU: ``gpu``; small shapes also
under Triton's interpreter here).

Histories are fresh random tokens, never 0 (an implementation that reads zero padding as tokens
would go unnoticed on zero-filled buffers), with earlier stretches pasted later so that long
n-grams recur; the columns past each row's length hold other random tokens, never read.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything compiles a Triton kernel
os.environ.setdefault("SPECDEC_JIT_BUILD", "1")

from specdec_plugin.ops.contract import ContractError  # noqa: E402
from specdec_plugin.ops.ngram_match.reference import ngram_match as reference  # noqa: E402
from specdec_plugin.spec_decode.ngram_index import ngram_propose_batch  # noqa: E402
from tests.ops.providers import (  # noqa: E402
    device_for,
    every_provider,
    host_providers,
    kernel,
    providers_to_compare,
    small_shape_device,
)

FOLDER = "ngram_match"

# (min_n, max_n, k, max_model_len): vLLM's defaults, single lengths, long k, the length cap.
SETTINGS = [(1, 3, 3, 10_000), (2, 5, 4, 10_000), (1, 1, 2, 10_000), (3, 3, 5, 10_000),
            (1, 8, 7, 10_000), (2, 4, 6, None)]  # None: max_model_len just past the longest rows


def histories(seed: int, batch: int, max_len: int, alphabet: int):
    """``(token_ids [batch, max_len] int32, num_tokens [batch] int32)`` with planted repeats."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, alphabet + 1, size=(batch, max_len), dtype=np.int32)
    num_tokens = rng.integers(0, max_len + 1, size=batch).astype(np.int32)
    num_tokens[:2] = (max_len, 0)  # a full row and an empty one
    for r in range(batch):
        n = int(num_tokens[r])
        for _ in range(int(rng.integers(0, 4)) if n > 2 else 0):
            length = int(rng.integers(2, 12))
            src = int(rng.integers(0, n - 1))
            dst = int(rng.integers(src + 1, n))
            piece = tokens[r, src:src + length].copy()[: n - dst]
            tokens[r, dst:dst + len(piece)] = piece
        if n > 8 and rng.random() < 0.5:  # end the row with an earlier stretch: a sure match
            length = int(rng.integers(1, min(9, n // 2)))
            src = int(rng.integers(0, n - length - 1))
            tokens[r, n - length:n] = tokens[r, src:src + length]
    return torch.from_numpy(tokens), torch.from_numpy(num_tokens)


def cpp_drafts(token_ids, num_tokens, min_n, max_n, k, max_model_len) -> list[list[int]]:
    rows = list(range(token_ids.shape[0]))
    return ngram_propose_batch(token_ids.numpy(), num_tokens.numpy(), rows, min_n, max_n, k,
                               max_model_len)


def as_lists(drafts: torch.Tensor, count: torch.Tensor) -> list[list[int]]:
    drafts, count = drafts.cpu(), count.cpu()
    # Past the count every column is -1 (the layout vLLM's ngram_gpu consumers expect).
    cols = torch.arange(drafts.shape[1])
    assert ((drafts == -1) == (cols.unsqueeze(0) >= count.unsqueeze(1))).all()
    return [drafts[b, : int(count[b])].tolist() for b in range(drafts.shape[0])]


@pytest.mark.parametrize("alphabet", [2, 3, 6, 40])
@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_reference_equals_cpp_index(alphabet, setting):
    min_n, max_n, k, max_model_len = setting
    token_ids, num_tokens = histories(alphabet * 1000 + sum(setting[:3]), 40, 96, alphabet)
    if max_model_len is None:
        max_model_len = 96 + 2  # rows of 94..96 tokens get fewer than k drafts
    drafts, count = reference(token_ids, num_tokens, None, min_n, max_n, k, max_model_len)
    want = cpp_drafts(token_ids, num_tokens, min_n, max_n, k, max_model_len)
    assert as_lists(drafts, count) == want
    if alphabet <= 6:
        assert sum(map(bool, want)) > 10  # the comparison is not vacuous


def test_longest_then_earliest():
    # [1 2 3] occurs at 0 (then 7) and at 4 (then 8): the longest n-gram, earliest occurrence.
    seq = torch.tensor([[1, 2, 3, 7, 1, 2, 3, 8, 5, 1, 2, 3]], dtype=torch.int32)
    n = torch.tensor([12], dtype=torch.int32)
    assert as_lists(*reference(seq, n, None, 1, 4, 3, 100)) == [[7, 1, 2]]
    assert as_lists(*reference(seq, n, None, 1, 1, 2, 100)) == [[7, 1]]  # 3 first at index 2
    assert as_lists(*reference(seq, n, None, 4, 5, 3, 100)) == [[]]  # nothing that long
    assert as_lists(*reference(seq, n, None, 1, 4, 3, 12)) == [[]]  # at max_model_len


def case(impl, device: str, seed: int, batch: int = 24, max_len: int = 300):
    """Every setting on one batch, half the rows inactive in one of them; flat outputs."""
    token_ids, num_tokens = histories(seed, batch, max_len, alphabet=3 + seed % 4)
    token_ids, num_tokens = token_ids.to(device), num_tokens.to(device)
    active = (torch.arange(batch) % 2 == 0).to(device)
    out = []
    for i, (min_n, max_n, k, max_model_len) in enumerate(SETTINGS):
        max_model_len = max_model_len or max_len + 2
        mask = active if i == 1 else None
        out += list(impl(token_ids, num_tokens, mask, min_n, max_n, k, max_model_len))
    return out


CASES = {"ngram_match": case}


@pytest.mark.parametrize("op,provider", providers_to_compare(FOLDER))
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_provider_matches_reference(op, provider, seed):
    device = device_for(provider)
    got = CASES[op](kernel(op, provider), device, seed)
    want = CASES[op](kernel(op, "torch"), device, seed)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert any((w > 0).any() for w in want[1::2])  # some row drafted


@pytest.mark.gpu
@pytest.mark.parametrize("max_len", [4096, 32768])
def test_triton_long_histories(max_len):
    """Long rows (tiles past the first, a scan that must stop early and one that must not)."""
    token_ids, num_tokens = histories(7, 64, max_len, alphabet=50)
    got = kernel("ngram_match", "triton")(token_ids.cuda(), num_tokens.cuda(), None, 2, 5, 4,
                                          max_len + 10)
    want = reference(token_ids, num_tokens, None, 2, 5, 4, max_len + 10)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)
    assert as_lists(*want) == cpp_drafts(token_ids, num_tokens, 2, 5, 4, max_len + 10)


def test_triton_small_shapes():
    """Our Triton kernel on small shapes wherever it can run (the interpreter on a CPU)."""
    from specdec_plugin.ops.ngram_match.triton import ngram_match as tri

    device = small_shape_device()
    got = case(tri, device, seed=5, batch=10, max_len=40)
    want = case(reference, "cpu", seed=5, batch=10, max_len=40)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# The contract's edges, for every provider (the reference included).

@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_contract_rejects_bad_inputs(op, provider):
    device = device_for(provider)
    token_ids, num_tokens = histories(3, 6, 20, 3)
    token_ids, num_tokens = token_ids.to(device), num_tokens.to(device)
    impl = kernel(op, provider)
    calls = {
        "1-D token_ids": (token_ids[0], num_tokens[:1], None, 1, 3, 3, 100),
        "float token_ids": (token_ids.float(), num_tokens, None, 1, 3, 3, 100),
        "num_tokens of another batch": (token_ids, num_tokens[:-1], None, 1, 3, 3, 100),
        "active of another batch": (token_ids, num_tokens, num_tokens[:-1] > 0, 1, 3, 3, 100),
        "min_n > max_n": (token_ids, num_tokens, None, 4, 3, 3, 100),
        "min_n 0": (token_ids, num_tokens, None, 0, 3, 3, 100),
        "negative k": (token_ids, num_tokens, None, 1, 3, -1, 100),
        "strided rows": (token_ids[:, ::2], num_tokens.clamp(max=10), None, 1, 3, 3, 100),
    }
    for what, args in calls.items():
        with pytest.raises(ContractError):
            impl(*args)
            pytest.fail(f"accepted: {what}")


@pytest.mark.parametrize("op,provider", host_providers(FOLDER))
def test_contract_rejects_counts_past_the_history(op, provider):
    token_ids, num_tokens = histories(4, 6, 20, 3)
    with pytest.raises(ContractError, match="num_tokens"):
        kernel(op, provider)(token_ids, num_tokens + 21, None, 1, 3, 3, 100)


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_no_drafts_asked_or_no_rows(op, provider):
    device = device_for(provider)
    impl = kernel(op, provider)
    token_ids, num_tokens = histories(5, 6, 20, 2)
    drafts, count = impl(token_ids.to(device), num_tokens.to(device), None, 1, 3, 0, 100)
    assert drafts.shape == (6, 0) and count.tolist() == [0] * 6  # k = 0: the plain step
    drafts, count = impl(token_ids[:0].to(device), num_tokens[:0].to(device), None, 1, 3, 3, 100)
    assert drafts.shape == (0, 3) and count.shape == (0,)
    inactive = torch.zeros(6, dtype=torch.bool, device=device)
    drafts, count = impl(token_ids.to(device), num_tokens.to(device), inactive, 1, 3, 3, 100)
    assert (count == 0).all() and (drafts == -1).all()
