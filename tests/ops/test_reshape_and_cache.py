"""KV-cache write (``ops/reshape_and_cache``): every registered provider against the torch
reference, on seeded random inputs.

The caches start full of random values (the "poison"): after the write, every slot must equal
what the reference gives, bit for bit, so slots that should be written were, and slots of padded
tokens (slot -1) and untouched slots kept their old contents. key/value are strided views with
rows past the slot mapping, which must not be read.

- Registry-driven: C++ on the CPU, Triton on a GPU (``gpu``); Triton's small shapes also run
  under its interpreter on CPU.
- Contract: every provider rejects mismatched shapes and more slots than key rows; providers on
  host memory also reject a slot past the cache; an empty or all-padding batch writes nothing.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from specdec_plugin.ops.contract import ContractError  # noqa: E402
from specdec_plugin.ops.reshape_and_cache import reference  # noqa: E402
from tests.ops.providers import (  # noqa: E402
    device_for,
    every_provider,
    generator,
    host_providers,
    kernel,
    providers_to_compare,
    small_shape_device,
)

FOLDER = "reshape_and_cache"


def make_case(num_tokens, num_kv_heads, head_size, block_size, num_blocks, dtype, cache_dtype,
              device, pad_fraction=0.25, seed=0):
    g = generator(seed)
    # key/value are strided views into a qkv-like buffer, with rows past the slot mapping.
    qkv = torch.randn(num_tokens + 2, 3 * num_kv_heads, head_size, generator=g)
    qkv = qkv.to(device=device, dtype=dtype)
    key, value = qkv[:, num_kv_heads: 2 * num_kv_heads], qkv[:, 2 * num_kv_heads:]
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    padded = torch.rand(num_tokens, generator=g) < pad_fraction
    slot_mapping = torch.where(padded, torch.full_like(slots, -1), slots).to(device)
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.randn(shape, generator=g).to(device=device, dtype=cache_dtype)
    value_cache = torch.randn(shape, generator=g).to(device=device, dtype=cache_dtype)
    return key, value, key_cache, value_cache, slot_mapping


def check(kernel, key, value, key_cache, value_cache, slot_mapping):
    want_k, want_v = key_cache.clone(), value_cache.clone()
    reference.reshape_and_cache(key, value, want_k, want_v, slot_mapping)
    before_k = key_cache.clone()
    kernel(key, value, key_cache, value_cache, slot_mapping)
    # A copy with one rounding: element-wise exact.
    torch.testing.assert_close(key_cache, want_k, rtol=0, atol=0)
    torch.testing.assert_close(value_cache, want_v, rtol=0, atol=0)
    # Non-vacuous: the write changed something.
    assert not torch.equal(key_cache, before_k)


SHAPES = [(7, 2, 32, 16), (20, 1, 64, 32), (33, 4, 16, 64), (40, 3, 64, 16)]
DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
          (torch.float16, torch.float16), (torch.float32, torch.bfloat16)]


def write_case(write, device, dtype, cache_dtype, shape):
    num_tokens, heads, head_size, block_size = shape
    case = make_case(num_tokens, heads, head_size, block_size, 6, dtype, cache_dtype, device,
                     seed=num_tokens)
    check(write, *case)


CASES = {"reshape_and_cache": write_case}


@pytest.mark.parametrize("op,provider", providers_to_compare(FOLDER))
@pytest.mark.parametrize("dtype,cache_dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_provider_matches_reference(op, provider, dtype, cache_dtype, shape):
    CASES[op](kernel(op, provider), device_for(provider), dtype, cache_dtype, shape)


@pytest.fixture(scope="module")
def small():
    from specdec_plugin.ops.reshape_and_cache.triton import reshape_and_cache

    return reshape_and_cache, small_shape_device()


@pytest.mark.parametrize("num_tokens,heads,head_size,block_size", SHAPES[:3])
def test_small_matches_reference(small, num_tokens, heads, head_size, block_size):
    kernel, device = small
    case = make_case(num_tokens, heads, head_size, block_size, 6, torch.float32, torch.float32,
                     device, seed=1)
    check(kernel, *case)


def test_small_converts_to_cache_dtype(small):
    kernel, device = small
    case = make_case(9, 2, 32, 16, 4, torch.float32, torch.float16, device, seed=2)
    check(kernel, *case)


def test_small_chunked_rows(small, monkeypatch):
    """Rows wider than one program's chunk are split across programs (grid axis 1)."""
    from specdec_plugin.ops.reshape_and_cache import triton as kv_triton

    kernel, device = small
    monkeypatch.setattr(kv_triton, "_MAX_CHUNK", 32)
    case = make_case(6, 3, 32, 16, 4, torch.float32, torch.float32, device, seed=3)
    check(kernel, *case)


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_all_padding_or_empty_writes_nothing(op, provider):
    write = kernel(op, provider)
    key, value, key_cache, value_cache, slot_mapping = make_case(
        5, 2, 32, 16, 3, torch.float32, torch.float32, device_for(provider), seed=4)
    before = key_cache.clone(), value_cache.clone()
    write(key, value, key_cache, value_cache, torch.full_like(slot_mapping, -1))
    write(key, value, key_cache, value_cache, slot_mapping[:0])
    assert torch.equal(key_cache, before[0]) and torch.equal(value_cache, before[1])


def _mismatched(key, value, key_cache, value_cache, slot_mapping) -> dict[str, tuple]:
    """Argument tuples, each with one shape or dtype the contract rejects."""
    return {
        "more slots than key rows": (key[:3], value[:3], key_cache, value_cache, slot_mapping),
        "key heads": (key[:, :1], value[:, :1], key_cache, value_cache, slot_mapping),
        "value shape": (key, value[:, :, :16], key_cache, value_cache, slot_mapping),
        "cache shapes": (key, value, key_cache, value_cache[:2], slot_mapping),
        "slot dtype": (key, value, key_cache, value_cache, slot_mapping.float()),
    }


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_contract_rejects_mismatched_shapes(op, provider):
    write = kernel(op, provider)
    key, value, key_cache, value_cache, slot_mapping = make_case(
        5, 2, 32, 16, 3, torch.float32, torch.float32, device_for(provider), seed=5)
    before = key_cache.clone()
    bad = _mismatched(key, value, key_cache, value_cache, slot_mapping)
    for what, args in bad.items():
        try:
            write(*args)
        except ContractError:
            continue
        pytest.fail(f"accepted: {what}")
    assert torch.equal(key_cache, before)


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_contract_rejects_a_bad_input_right_after_a_good_one(op, provider):
    """The structural checks are skipped for tensors of the structure that passed last
    (validate.py: PassedStructure): each bad input, right after a good call, must still fail,
    and fail again on a repeat (a failing structure is never remembered)."""
    write = kernel(op, provider)
    key, value, key_cache, value_cache, slot_mapping = make_case(
        5, 2, 32, 16, 3, torch.float32, torch.float32, device_for(provider), seed=7)
    good = (key, value, key_cache, value_cache, slot_mapping)
    strided = lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2)  # noqa: E731
    bad = {
        **_mismatched(key, value, key_cache, value_cache, slot_mapping),
        "slot_mapping 2-D": (key, value, key_cache, value_cache, slot_mapping[None]),
        "key head stride": (strided(key), value, key_cache, value_cache, slot_mapping),
        "value cache head stride": (key, value, key_cache, strided(value_cache), slot_mapping),
    }
    for what, args in bad.items():
        write(*good)
        before = key_cache.clone(), value_cache.clone()
        for _ in range(2):
            try:
                write(*args)
            except ContractError:
                continue
            pytest.fail(f"accepted after a good call: {what}")
        assert torch.equal(key_cache, before[0]) and torch.equal(value_cache, before[1])


@pytest.mark.parametrize("op,provider", host_providers(FOLDER))
def test_contract_rejects_slot_past_the_cache(op, provider):
    key, value, key_cache, value_cache, slot_mapping = make_case(
        5, 2, 32, 16, 3, torch.float32, torch.float32, "cpu", seed=6)
    slot_mapping[2] = 3 * 16  # one past the last slot
    before = key_cache.clone()
    with pytest.raises(ContractError, match="slot"):
        kernel(op, provider)(key, value, key_cache, value_cache, slot_mapping)
    assert torch.equal(key_cache, before)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,cache_dtype", DTYPES)
@pytest.mark.parametrize("heads,head_size,block_size", [(8, 128, 16), (32, 128, 32), (2, 64, 64)])
def test_gpu_matches_reference(dtype, cache_dtype, heads, head_size, block_size):
    from specdec_plugin.ops.reshape_and_cache.triton import reshape_and_cache

    case = make_case(2000, heads, head_size, block_size, 400, dtype, cache_dtype, "cuda")
    check(reshape_and_cache, *case)
