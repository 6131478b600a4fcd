"""Triton KV-cache write against the pure-torch reference, on fresh random inputs each run.

Tiny shapes run in Triton's interpreter on CPU (see tests/conftest.py). The caches start full
of random values (the "poison"): after the write, every slot must equal what the reference gives, so slots that should be written were, and slots of padded tokens
(slot -1) and untouched slots kept their old contents, bit for bit.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from specdec_plugin.ops.reshape_and_cache import reference  # noqa: E402

from .test_paged_attention import small_shape_device  # noqa: E402


def make_case(num_tokens, num_kv_heads, head_size, block_size, num_blocks, dtype, cache_dtype,
              device, pad_fraction=0.25):
    # key/value are strided views into a qkv-like buffer, with rows past the slot mapping.
    qkv = torch.randn(num_tokens + 2, 3 * num_kv_heads, head_size, device=device).to(dtype)
    key, value = qkv[:, num_kv_heads: 2 * num_kv_heads], qkv[:, 2 * num_kv_heads:]
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    padded = torch.rand(num_tokens, device=device) < pad_fraction
    slot_mapping = torch.where(padded, torch.full_like(slots, -1), slots)
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.randn(shape, device=device).to(cache_dtype)
    value_cache = torch.randn(shape, device=device).to(cache_dtype)
    return key, value, key_cache, value_cache, slot_mapping


def check(kernel, key, value, key_cache, value_cache, slot_mapping):
    want_k, want_v = key_cache.clone(), value_cache.clone()
    reference.reshape_and_cache(key, value, want_k, want_v, slot_mapping)
    before_k = key_cache.clone()
    kernel(key, value, key_cache, value_cache, slot_mapping)
    assert torch.equal(key_cache, want_k)
    assert torch.equal(value_cache, want_v)
    # Non-vacuous: the write changed something, and padded tokens existed in the case.
    assert not torch.equal(key_cache, before_k)


@pytest.fixture(scope="module")
def small():
    from specdec_plugin.ops.reshape_and_cache.triton import reshape_and_cache

    return reshape_and_cache, small_shape_device()


@pytest.mark.parametrize("num_tokens,heads,head_size,block_size", [
    (7, 2, 32, 16), (20, 1, 64, 32), (33, 4, 16, 64),
])
def test_small_matches_reference(small, num_tokens, heads, head_size, block_size):
    kernel, device = small
    case = make_case(num_tokens, heads, head_size, block_size, 6, torch.float32, torch.float32,
                     device)
    check(kernel, *case)


def test_small_all_padding_leaves_cache_alone(small):
    kernel, device = small
    key, value, key_cache, value_cache, slot_mapping = make_case(
        5, 2, 32, 16, 3, torch.float32, torch.float32, device)
    slot_mapping.fill_(-1)
    before = key_cache.clone(), value_cache.clone()
    kernel(key, value, key_cache, value_cache, slot_mapping)
    assert torch.equal(key_cache, before[0]) and torch.equal(value_cache, before[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,cache_dtype", [
    (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
    (torch.float32, torch.float32), (torch.float32, torch.bfloat16),
])
@pytest.mark.parametrize("heads,head_size,block_size", [(8, 128, 16), (32, 128, 32), (2, 64, 64)])
def test_gpu_matches_reference(dtype, cache_dtype, heads, head_size, block_size):
    from specdec_plugin.ops.reshape_and_cache.triton import reshape_and_cache

    case = make_case(2000, heads, head_size, block_size, 400, dtype, cache_dtype, "cuda")
    check(reshape_and_cache, *case)
