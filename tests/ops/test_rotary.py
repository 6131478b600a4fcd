"""Rotary embedding (``ops/rotary``): every registered provider against the torch reference,
the reference against vLLM's own op, and the contract's edges.

- Registry-driven: each provider the registry lists rotates seeded random q/k, column views of
  one fused qkv buffer, in place; the whole buffer must match the reference's element by
  element, so the pass-through dims (partial rotary) and the value columns stay untouched.
- Small shapes under Triton's interpreter on CPU (the Triton provider's ``gpu`` case needs a
  GPU); there numpy rounds each product and sum as torch does, so they are bit-equal.
- Contract: every provider rejects a rotary_dim past the head and a cache of the wrong width;
  providers on host memory also reject a position past the cos/sin cache; empty batches pass.
"""
from __future__ import annotations

import pytest
import torch

from specdec_plugin.ops.contract import ContractError
from specdec_plugin.ops.rotary import reference as rope_ref
from tests.ops.layers import qkv_case, tol
from tests.ops.providers import (device_for, every_provider, generator, host_providers,
                                 kernel, providers_to_compare, small_shape_device)

FOLDER = "rotary"
ALL_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [  # head_size, rotary_dim, q heads, k heads (0: no key)
    (32, 32, 4, 2), (64, 16, 3, 1), (16, 8, 40, 0),
]


def rotary_case(rope, device, dtype, seed, shape, is_neox):
    head_size, rotary_dim, hq, hk = shape
    qkv, q, k, cache, positions = qkv_case(5, hq, hk, head_size, 64, rotary_dim, dtype, device,
                                           generator(seed))
    before = qkv.clone()
    out_q, out_k = rope(positions, q, k if hk else None, cache, head_size, rotary_dim, is_neox)
    assert out_q is q and out_k is (k if hk else None)
    # Non-vacuous: the rotated part changed.
    assert not torch.equal(qkv[:, :hq * head_size], before[:, :hq * head_size])
    return {"qkv": qkv}


CASES = {"rotary_embedding": rotary_case}


@pytest.mark.parametrize("op,provider", providers_to_compare(FOLDER))
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_provider_matches_reference(op, provider, dtype, shape, is_neox):
    device = device_for(provider)
    got = CASES[op](kernel(op, provider), device, dtype, 0, shape, is_neox)
    want = CASES[op](kernel(op, "torch"), device, dtype, 0, shape, is_neox)
    # A GPU compiler may contract one product into its sum (an FMA): one rounding fewer, so an
    # element may differ by about one unit of the dtype at its magnitude (tests/ops: gpu).
    torch.testing.assert_close(got["qkv"], want["qkv"], **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_triton_small_shapes(dtype, shape, is_neox):
    from specdec_plugin.ops.rotary.triton import apply_rotary

    device = small_shape_device()
    got = rotary_case(apply_rotary, device, dtype, 1, shape, is_neox)
    want = rotary_case(rope_ref.apply_rotary, device, dtype, 1, shape, is_neox)
    if device == "cpu":  # numpy rounds each product and sum as torch does: bit-equal
        assert torch.equal(got["qkv"], want["qkv"])
    torch.testing.assert_close(got["qkv"], want["qkv"], **tol(dtype))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reference_equals_vllm_native(vllm_config, dtype):
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    for is_neox in (True, False):
        for rotary_dim in (32, 16):
            rope = RotaryEmbedding(32, rotary_dim, 128, 10000.0, is_neox, dtype)
            _, q, k, _, positions = qkv_case(7, 4, 2, 32, 128, rotary_dim, dtype)
            want_q, want_k = rope.forward_native(positions, q.clone(), k.clone())
            got_q, got_k = rope_ref.apply_rotary(positions, q.clone(), k.clone(),
                                                 rope.cos_sin_cache, 32, rotary_dim, is_neox)
            assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
            want_q, none = rope.forward_native(positions, q.clone(), None)
            got_q, _ = rope_ref.apply_rotary(positions, q.clone(), None, rope.cos_sin_cache, 32,
                                             rotary_dim, is_neox)
            assert none is None and torch.equal(got_q, want_q)


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_contract_rejects_bad_shapes(op, provider):
    rope = kernel(op, provider)
    _, q, k, cache, positions = qkv_case(5, 4, 2, 32, 64, 32, torch.float32, device_for(provider))
    with pytest.raises(ContractError, match="rotary_dim"):
        rope(positions, q, k, cache, 32, 48, True)
    with pytest.raises(ContractError, match="cos_sin_cache"):
        rope(positions, q, k, cache[:, :16], 32, 32, True)


@pytest.mark.parametrize("op,provider", host_providers(FOLDER))
def test_contract_rejects_position_past_cache(op, provider):
    _, q, k, cache, positions = qkv_case(5, 4, 2, 32, 64, 32, torch.float32)
    positions[3] = 64
    before = q.clone()
    with pytest.raises(ContractError, match="position"):
        kernel(op, provider)(positions, q, k, cache, 32, 32, True)
    assert torch.equal(q, before)  # rejected before anything was written


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_empty_batch(op, provider):
    _, q, k, cache, positions = qkv_case(0, 4, 2, 32, 64, 32, torch.float32, device_for(provider))
    out_q, out_k = kernel(op, provider)(positions, q, k, cache, 32, 32, True)
    assert out_q.shape == (0, 128) and out_k.shape == (0, 64)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_cpp_fresh_inputs_bit_equal_and_row_invariant(dtype, is_neox):
    """The C++ rotary (csrc/cpu_layer_ops.cpp) on fresh random inputs rounds each product and
    sum as the reference does: bit-equal, and a token alone equals the same token in a batch."""
    import random

    seed = random.randrange(1 << 30)
    tokens = random.randint(1, 20)
    qkv, q, k, cache, positions = qkv_case(tokens, 9, 3, 64, 256, 64, dtype,
                                           generator=generator(seed))
    want = qkv.clone()
    rope_ref.apply_rotary(positions, want[:, :576], want[:, 576:768], cache, 64, 64, is_neox)
    kernel("rotary_embedding", "cpp")(positions, q, k, cache, 64, 64, is_neox)
    assert torch.equal(qkv, want), f"seed {seed}"
    alone = qkv[-1:].clone()  # already rotated: rotate the original last row alone instead
    alone.copy_(qkv_case(tokens, 9, 3, 64, 256, 64, dtype, generator=generator(seed))[0][-1:])
    kernel("rotary_embedding", "cpp")(positions[-1:], alone[:, :576], alone[:, 576:768], cache,
                                      64, 64, is_neox)
    assert torch.equal(alone[0], qkv[-1]), f"seed {seed}"
