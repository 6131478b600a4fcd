"""The CPU C++ attention kernels (csrc/cpu_attention.cpp) against the pure-torch references,
on fresh random inputs each run: paged attention (decode, 1+K verification, prefill, chunked
prefill, padding rows, GQA, scattered blocks) and the KV-cache write (padded slots skipped)."""
from __future__ import annotations

import random

import pytest
import torch

from specdec_plugin.ops.paged_attention import cpp as attn_cpp
from specdec_plugin.ops.reshape_and_cache import cpp as cache_cpp
from specdec_plugin.ops.reshape_and_cache import reference as cache_ref
from tests.ops.test_paged_attention import make_case, random_lengths, reference_out

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _check(case, dtype):
    out = torch.full_like(case["query"], float("nan"))
    attn_cpp.paged_attention(**case, out=out)
    ref = reference_out(case)
    written = ~torch.isnan(ref)
    assert torch.equal(~torch.isnan(out), written), "real rows unwritten or padding rows written"
    rel = ((out[written].float() - ref[written]).norm() / ref[written].norm()).item()
    assert rel < TOL[dtype], f"relative error {rel:.2e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("trial", range(4))
def test_random_batches(dtype, trial):
    rng = random.Random()
    q_lens, seq_lens = random_lengths(rng, rng.randint(1, 6), max_spec=8, long_prefill=40,
                                      max_context=200)
    hkv = rng.choice([1, 3])
    case = make_case(q_lens, seq_lens, hkv * rng.choice([1, 3]), hkv, rng.choice([64, 40]),
                     rng.choice([16, 32]), dtype, "cpu")
    _check(case, dtype)


def test_smollm2_decode_and_verify_shapes():
    # The shapes the engine runs: 9 query / 3 KV heads of 64, blocks of 16, batch 8, 1+K=4.
    case = make_case([1, 4, 1, 4, 1, 1, 4, 0], [37, 120, 5, 64, 300, 17, 4, 0], 9, 3, 64, 16,
                     torch.float32, "cpu")
    _check(case, torch.float32)


def test_a_wrong_scale_is_caught():
    case = make_case([1, 4], [20, 30], 4, 2, 64, 16, torch.float32, "cpu")
    out = torch.full_like(case["query"], float("nan"))
    attn_cpp.paged_attention(**{**case, "scale": case["scale"] * 1.1}, out=out)
    ref = reference_out(case)
    written = ~torch.isnan(ref)
    assert ((out[written] - ref[written]).norm() / ref[written].norm()).item() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reshape_and_cache_matches_reference(dtype):
    num_blocks, block_size, heads, head = 12, 16, 3, 64
    tokens = random.randint(1, 40)
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[torch.rand(tokens) < 0.2] = -1  # padded tokens
    qkv = torch.randn(tokens + 2, 3 * heads, head)  # strided K/V views with padding rows
    key, value = qkv[:, heads:2 * heads], qkv[:, 2 * heads:]
    caches = [torch.randn(num_blocks, block_size, heads, head).to(dtype) for _ in range(2)]
    ours = [c.clone() for c in caches]
    cache_ref.reshape_and_cache(key, value, caches[0], caches[1], slots)
    cache_cpp.reshape_and_cache(key, value, ours[0], ours[1], slots)
    assert torch.equal(ours[0], caches[0]) and torch.equal(ours[1], caches[1])
