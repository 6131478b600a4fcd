"""SiLU-and-mul (``ops/activation``): every registered provider against the torch reference,
the reference against vLLM's own op, and the contract's edges.

- Registry-driven: each provider the registry lists runs on seeded random inputs (contiguous,
  strided, 3-D, a width past one column block) and must match the reference element by
  element; outputs start as NaN (``nan_empty``), so an unwritten element fails.
- Small shapes under Triton's interpreter on CPU (the Triton provider's ``gpu`` case needs a
  GPU).
- Contract: every provider rejects an odd last dimension and takes an empty batch.
"""
from __future__ import annotations

import pytest
import torch

from specdec_plugin.ops.activation import reference as act_ref
from specdec_plugin.ops.contract import ContractError
from tests.ops.layers import randn, tol
from tests.ops.providers import (device_for, every_provider, generator, kernel,
                                 providers_to_compare, small_shape_device)

FOLDER = "activation"
ALL_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def silu_and_mul_case(act, device, dtype, seed, width=2 * 1100):
    g = generator(seed)
    x = randn(5, width, dtype=dtype, device=device, generator=g) * 3
    strided = randn(4, width + 6, dtype=dtype, device=device, generator=g)[:, 3: 3 + width]
    out = act(x)
    assert out.shape == (5, width // 2)
    return {"rows": out, "strided": act(strided), "3d": act(x[:4].reshape(2, 2, width))}


CASES = {"silu_and_mul": silu_and_mul_case}


@pytest.mark.parametrize("op,provider", providers_to_compare(FOLDER))
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_provider_matches_reference(nan_empty, op, provider, dtype, seed):
    device = device_for(provider)
    got = CASES[op](kernel(op, provider), device, dtype, seed)
    want = CASES[op](kernel(op, "torch"), device, dtype, seed)
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=name, **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("width", [2 * 48, 2 * 1100])
def test_triton_small_shapes(nan_empty, dtype, width):
    from specdec_plugin.ops.activation.triton import silu_and_mul

    device = small_shape_device()
    got = silu_and_mul_case(silu_and_mul, device, dtype, 2, width)
    want = silu_and_mul_case(act_ref.silu_and_mul, device, dtype, 2, width)
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=name, **tol(dtype))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reference_equals_vllm_native(vllm_config, dtype):
    from vllm.model_executor.layers.activation import SiluAndMul

    x = randn(2, 5, 2 * 24, dtype=dtype) * 3
    assert torch.equal(act_ref.silu_and_mul(x), SiluAndMul.forward_native(x))


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_contract_rejects_odd_width(op, provider):
    with pytest.raises(ContractError, match="2 \\* d"):
        kernel(op, provider)(randn(3, 9, dtype=torch.float32, device=device_for(provider)))


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_empty_batch(op, provider):
    x = randn(0, 8, dtype=torch.float32, device=device_for(provider))
    assert kernel(op, provider)(x).shape == (0, 4)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_cpp_fresh_inputs_and_row_invariance(dtype):
    """The C++ SiLU-and-mul (csrc/cpu_layer_ops.cpp) on fresh random inputs: close to the
    reference, and a row alone bit-identical to the same row in a batch."""
    import random

    seed = random.randrange(1 << 30)
    g = generator(seed)
    rows, width = random.randint(2, 40), 2 * random.choice([1536, 7, 100])
    x = randn(rows, width, dtype=dtype, generator=g) * 4
    cpp = kernel("silu_and_mul", "cpp")
    out = cpp(x)
    torch.testing.assert_close(out, act_ref.silu_and_mul(x), msg=f"seed {seed}", **tol(dtype))
    for i in (0, rows - 1):
        assert torch.equal(cpp(x[i:i + 1].clone())[0], out[i]), f"seed {seed}"
