"""RMSNorm (``ops/rms_norm``): every registered provider against the torch reference, the
reference against vLLM's own op, and the contract's edges.

- Registry-driven: each provider the registry lists for ``rms_norm`` runs on seeded random
  inputs (strided rows, with and without weight and residual) and must match the reference
  element by element; outputs start as NaN (``nan_empty``), so an unwritten element fails.
- Small shapes under Triton's interpreter on CPU (the Triton provider's ``gpu`` case needs a
  GPU). bf16 is left to the GPU: the interpreter truncates fp32 -> bf16 where the GPU rounds.
- The reference equals vLLM's ``forward_native`` bit for bit on CPU.
- Contract: every provider rejects a weight or residual of the wrong shape, and takes an empty
  batch.
"""
from __future__ import annotations

import pytest
import torch

from specdec_plugin.ops.contract import ContractError
from specdec_plugin.ops.rms_norm import reference as norm_ref
from tests.ops.layers import randn, tol
from tests.ops.providers import (device_for, every_provider, generator, kernel,
                                 providers_to_compare, small_shape_device)

FOLDER = "rms_norm"
ALL_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def rms_norm_case(norm, device, dtype, seed, hidden=96):
    g = generator(seed)
    x = randn(9, hidden + 8, dtype=dtype, device=device, generator=g)[:, 4: 4 + hidden]
    weight = (1 + 0.2 * randn(hidden, dtype=torch.float32, generator=g)).to(device, dtype)
    residual = randn(9, hidden, dtype=dtype, device=device, generator=g)
    out, new_residual = norm(x, weight, 1e-5, residual)
    return {"weighted": norm(x, weight, 1e-5), "bare": norm(x, None, 1e-6),
            "fused": out, "residual": new_residual,
            "3d": norm(x.reshape(3, 3, hidden), weight, 1e-6)}


CASES = {"rms_norm": rms_norm_case}
EXACT = {"residual"}  # one fp32 add, one rounding


@pytest.mark.parametrize("op,provider", providers_to_compare(FOLDER))
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_provider_matches_reference(nan_empty, op, provider, dtype, seed):
    device = device_for(provider)
    got = CASES[op](kernel(op, provider), device, dtype, seed)
    want = CASES[op](kernel(op, "torch"), device, dtype, seed)
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=name,
                                   **(dict(rtol=0, atol=0) if name in EXACT else tol(dtype)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("hidden,single_pass", [(96, True), (100, False), (64, True)])
def test_triton_small_shapes(nan_empty, monkeypatch, dtype, hidden, single_pass):
    from specdec_plugin.ops.rms_norm import triton as norm_triton

    device = small_shape_device()
    if not single_pass:  # force the two-pass path (and a ragged last chunk) on a small row
        monkeypatch.setattr(norm_triton, "_MAX_SINGLE_PASS", 32)
    got = rms_norm_case(norm_triton.rms_norm, device, dtype, 3, hidden)
    want = rms_norm_case(norm_ref.rms_norm, device, dtype, 3, hidden)
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=name,
                                   **(dict(rtol=0, atol=0) if name in EXACT else tol(dtype)))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reference_equals_vllm_native(vllm_config, dtype):
    from vllm.model_executor.layers.layernorm import RMSNorm

    norm = RMSNorm(80, eps=1e-5, dtype=dtype)
    norm.weight.data.copy_(randn(80, dtype=dtype))
    x, res = randn(6, 80, dtype=dtype), randn(6, 80, dtype=dtype)
    assert torch.equal(norm_ref.rms_norm(x, norm.weight.data, 1e-5), norm.forward_native(x))
    want = norm.forward_native(x.clone(), res.clone())
    got = norm_ref.rms_norm(x, norm.weight.data, 1e-5, res)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    bare = RMSNorm(80, eps=1e-6, has_weight=False, dtype=dtype)
    assert torch.equal(norm_ref.rms_norm(x, None, 1e-6), bare.forward_native(x))


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_contract_rejects_mismatched_shapes(op, provider):
    norm, device = kernel(op, provider), device_for(provider)
    x = randn(4, 32, dtype=torch.float32, device=device)
    with pytest.raises(ContractError, match="weight"):
        norm(x, randn(31, dtype=torch.float32, device=device), 1e-5)
    with pytest.raises(ContractError, match="residual"):
        norm(x, None, 1e-5, randn(4, 33, dtype=torch.float32, device=device))


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_empty_batch(op, provider):
    norm, device = kernel(op, provider), device_for(provider)
    x = randn(0, 32, dtype=torch.float32, device=device)
    out, res = norm(x, torch.ones(32, device=device), 1e-5, x.clone())
    assert out.shape == (0, 32) and res.shape == (0, 32)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_cpp_fresh_inputs_and_row_invariance(dtype):
    """The C++ norm (csrc/cpu_layer_ops.cpp) on fresh random inputs: close to the reference, the
    residual sum bit-equal, and each row bit-identical alone and inside a batch (speculative
    verification compares a 1-row decode with a (1+K)-row step)."""
    import random

    seed = random.randrange(1 << 30)
    g = generator(seed)
    rows, hidden = random.randint(2, 40), random.choice([576, 960, 100, 8])
    x = randn(rows, hidden, dtype=dtype, generator=g) * 4
    weight = (1 + 0.2 * randn(hidden, dtype=torch.float32, generator=g)).to(dtype)
    residual = randn(rows, hidden, dtype=dtype, generator=g)
    cpp = kernel("rms_norm", "cpp")
    out, res = cpp(x, weight, 1e-5, residual)
    want, want_res = norm_ref.rms_norm(x, weight, 1e-5, residual)
    torch.testing.assert_close(out, want, msg=f"seed {seed}", **tol(dtype))
    assert torch.equal(res, want_res), f"seed {seed}"
    for i in (0, rows - 1):
        alone, alone_res = cpp(x[i:i + 1].clone(), weight, 1e-5, residual[i:i + 1].clone())
        assert torch.equal(alone[0], out[i]) and torch.equal(alone_res[0], res[i]), f"seed {seed}"
