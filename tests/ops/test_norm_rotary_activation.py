"""RMSNorm, rotary embedding and SiLU-and-mul: Triton vs reference vs vLLM, and the OOT wiring.

- Triton vs the torch reference on fresh random inputs, small shapes (Triton's interpreter on
  CPU). Fresh output buffers are poisoned with NaN, so an element the kernel fails to write
  shows. bf16 is left to the GPU tests: the interpreter truncates fp32 -> bf16 casts where the
  GPU rounds to nearest even.
- The reference vs vLLM's own ``forward_native``, bit for bit on CPU, so the reference is what
  vLLM computes.
- After ``register_custom_ops``, vLLM's constructors build our subclasses, and their
  ``forward_oot`` equals ``forward_native`` (torch provider), fallbacks included.
- ``gpu``: real 7B-class shapes in bf16/fp16.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from specdec_plugin.ops.activation import reference as act_ref  # noqa: E402
from specdec_plugin.ops.rms_norm import reference as norm_ref  # noqa: E402
from specdec_plugin.ops.rotary import reference as rope_ref  # noqa: E402

from .test_paged_attention import small_shape_device  # noqa: E402

SMALL_DTYPES = [torch.float32, torch.float16]
ALL_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def randn(*shape, dtype, device="cpu"):
    return torch.randn(*shape, device=device).to(dtype)


@pytest.fixture
def nan_empty(monkeypatch):
    """``torch.empty`` that returns NaN-filled floating tensors while the test runs."""
    real_empty = torch.empty

    def poisoned(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)


def tol(dtype):
    # Half precision: two units in the last place (2^-9 for fp16, 2^-6 for bf16, relative), since
    # fp32 results that differ only in summation order or rsqrt rounding can round to outputs two
    # ulps apart (seen on the H100: fp16 rms_norm, 1 element of 2M, 0.0039 at 2.5).
    return {"float32": dict(rtol=1e-5, atol=1e-5), "float16": dict(rtol=2e-3, atol=1e-3),
            "bfloat16": dict(rtol=1.6e-2, atol=1e-2)}[str(dtype).split(".")[-1]]


def qkv_case(tokens, hq, hk, head_size, max_pos, rotary_dim, dtype, device="cpu"):
    """q/k as column views of one fused qkv buffer (as vLLM's attention layers pass them)."""
    qkv = randn(tokens, (hq + 2 * hk) * head_size, dtype=dtype, device=device)
    q, k = qkv[:, : hq * head_size], qkv[:, hq * head_size: (hq + hk) * head_size]
    cache = torch.randn(max_pos, rotary_dim, device=device)
    positions = torch.randint(0, max_pos, (tokens,), device=device)
    return qkv, q, k, cache, positions


# --------------------------------------------------------------------------- Triton vs reference
@pytest.fixture(scope="module")
def device():
    return small_shape_device()


@pytest.mark.parametrize("dtype", SMALL_DTYPES)
@pytest.mark.parametrize("hidden,single_pass", [(96, True), (100, False), (64, True)])
def test_rms_norm_triton(device, nan_empty, monkeypatch, dtype, hidden, single_pass):
    from specdec_plugin.ops.rms_norm import triton as norm_triton

    if not single_pass:  # force the two-pass path (and a ragged last chunk) on a small row
        monkeypatch.setattr(norm_triton, "_MAX_SINGLE_PASS", 32)
    buf = randn(7, hidden + 8, dtype=dtype, device=device)
    x = buf[:, 4: 4 + hidden]  # strided rows
    weight, residual = randn(hidden, dtype=dtype, device=device), randn(7, hidden, dtype=dtype,
                                                                         device=device)
    for w in (weight, None):
        got = norm_triton.rms_norm(x, w, 1e-5)
        torch.testing.assert_close(got, norm_ref.rms_norm(x, w, 1e-5), **tol(dtype))
        got_out, got_res = norm_triton.rms_norm(x, w, 1e-5, residual)
        want_out, want_res = norm_ref.rms_norm(x, w, 1e-5, residual)
        torch.testing.assert_close(got_out, want_out, **tol(dtype))
        assert torch.equal(got_res, want_res)  # one fp32 add, one rounding: exact
    assert not torch.equal(got_res, residual)  # the fused add did something
    x3 = randn(2, 3, hidden, dtype=dtype, device=device)
    torch.testing.assert_close(norm_triton.rms_norm(x3, weight, 1e-6),
                               norm_ref.rms_norm(x3, weight, 1e-6), **tol(dtype))


@pytest.mark.parametrize("dtype", SMALL_DTYPES)
@pytest.mark.parametrize("shape", [(5, 2 * 48), (2, 3, 2 * 1100)])
def test_silu_and_mul_triton(device, nan_empty, dtype, shape):
    from specdec_plugin.ops.activation.triton import silu_and_mul

    x = randn(*shape, dtype=dtype, device=device) * 3
    got = silu_and_mul(x)
    assert got.shape == (*shape[:-1], shape[-1] // 2)
    torch.testing.assert_close(got, act_ref.silu_and_mul(x), **tol(dtype))
    strided = randn(4, shape[-1] + 6, dtype=dtype, device=device)[:, 3: 3 + shape[-1]]
    torch.testing.assert_close(silu_and_mul(strided), act_ref.silu_and_mul(strided), **tol(dtype))


@pytest.mark.parametrize("dtype", SMALL_DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("head_size,rotary_dim,hq,hk", [(32, 32, 4, 2), (64, 16, 3, 1),
                                                        (16, 8, 40, 0)])
def test_rotary_triton(device, dtype, is_neox, head_size, rotary_dim, hq, hk):
    from specdec_plugin.ops.rotary.triton import apply_rotary

    qkv, q, k, cache, positions = qkv_case(5, hq, hk, head_size, 64, rotary_dim, dtype, device)
    key = k if hk else None
    want = qkv.clone()
    wq = want[:, : hq * head_size]
    wk = want[:, hq * head_size: (hq + hk) * head_size] if hk else None
    rope_ref.apply_rotary(positions, wq, wk, cache, head_size, rotary_dim, is_neox)
    before = qkv.clone()
    out_q, out_k = apply_rotary(positions.int(), q, key, cache, head_size, rotary_dim, is_neox)
    assert out_q is q and out_k is key
    if device == "cpu":  # numpy rounds each product and sum as torch does: bit-equal
        assert torch.equal(qkv, want)
    torch.testing.assert_close(qkv, want, **tol(dtype))
    # Pass-through dims and the value columns are untouched, bit for bit.
    heads = qkv.view(5, -1, head_size)
    assert torch.equal(heads[:, :, rotary_dim:], before.view(5, -1, head_size)[:, :, rotary_dim:])
    assert torch.equal(heads[:, hq + hk:], before.view(5, -1, head_size)[:, hq + hk:])
    assert not torch.equal(heads[:, :hq, :rotary_dim], before.view(5, -1, head_size)[:, :hq,
                                                                                   :rotary_dim])


# --------------------------------------------------------------------------- reference vs vLLM
@pytest.fixture(scope="module")
def vllm_config():
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        yield


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_references_equal_vllm_native(vllm_config, dtype):
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    norm = RMSNorm(80, eps=1e-5, dtype=dtype)
    norm.weight.data.copy_(randn(80, dtype=dtype))
    x, res = randn(6, 80, dtype=dtype), randn(6, 80, dtype=dtype)
    assert torch.equal(norm_ref.rms_norm(x, norm.weight.data, 1e-5), norm.forward_native(x))
    want = norm.forward_native(x.clone(), res.clone())
    got = norm_ref.rms_norm(x, norm.weight.data, 1e-5, res)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    bare = RMSNorm(80, eps=1e-6, has_weight=False, dtype=dtype)
    assert torch.equal(norm_ref.rms_norm(x, None, 1e-6), bare.forward_native(x))

    x = randn(2, 5, 2 * 24, dtype=dtype) * 3
    assert torch.equal(act_ref.silu_and_mul(x), SiluAndMul.forward_native(x))

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


# --------------------------------------------------------------------------- OOT wiring
@pytest.fixture
def registered(vllm_config):
    """``register_custom_ops(("torch",))`` for one test, undone afterwards."""
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.rotary_embedding import _ROPE_DICT

    from specdec_plugin.ops import custom_ops

    before, ropes_before = dict(op_registry_oot), dict(_ROPE_DICT)
    names = custom_ops.register_custom_ops(("torch",))
    yield names
    op_registry_oot.clear()
    op_registry_oot.update(before)
    _ROPE_DICT.clear()  # get_rope caches layers: drop the ones built as ours
    _ROPE_DICT.update(ropes_before)
    custom_ops._providers = ("torch",)


def test_vllm_builds_our_layers(registered):
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.rotary_embedding import get_rope

    from specdec_plugin.ops import custom_ops

    assert {"RMSNorm", "SiluAndMul", "RotaryEmbedding", "Llama3RotaryEmbedding"} <= set(registered)
    assert custom_ops.register_custom_ops(("torch",)) == []  # idempotent
    norm = RMSNorm(64)
    assert type(norm).__name__ == "SpecDecRMSNorm" and isinstance(norm, RMSNorm)
    assert type(norm).name == "rms_norm"
    assert norm._forward_method.__func__ is custom_ops._RMSNormOot.forward_oot
    norm.weight.data.normal_()
    x, res = torch.randn(5, 64), torch.randn(5, 64)
    assert torch.equal(norm(x), norm.forward_native(x))
    got, want = norm(x, res), norm.forward_native(x.clone(), res.clone())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    narrow = RMSNorm(64, var_hidden_size=32)  # falls back to vLLM's native op
    assert torch.equal(narrow(x), narrow.forward_native(x))

    act = SiluAndMul()
    assert type(act).__name__ == "SpecDecSiluAndMul"
    x = torch.randn(3, 40)
    assert torch.equal(act(x), SiluAndMul.forward_native(x))

    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 7.0}
    for rope in (get_rope(32, 96, False, {"rope_theta": 7.0, "partial_rotary_factor": 0.5}),
                 get_rope(32, 96, True, llama3)):
        assert type(rope).__name__.startswith("SpecDec")
        _, q, k, _, positions = qkv_case(6, 4, 2, 32, 96, rope.rotary_dim, torch.float32)
        k_before = k.clone()
        want_q, want_k = rope.forward_native(positions, q.clone(), k.clone())
        got_q, got_k = rope(positions, q, k)
        assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
        assert torch.equal(q, want_q)  # in place, like vLLM's CUDA op
        got_q, none = rope(positions, k_before, None)
        assert none is None and torch.equal(got_q, want_k)
        # query with no unit-strided [tokens, heads, head_size] view: vLLM's native op instead
        q_t = q.t().contiguous().t()
        want_q, _ = rope.forward_native(positions, q_t.clone(), None)
        assert torch.equal(rope(positions, q_t, None)[0], want_q)


def test_custom_ops_switch_applies_to_our_layers(registered):
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm

    from specdec_plugin.ops.custom_ops import custom_ops_forced

    config = VllmConfig(compilation_config=CompilationConfig(custom_ops=["none", "+rms_norm"]))
    with set_current_vllm_config(config):
        norm = RMSNorm(16)
        assert type(norm).__name__ == "SpecDecRMSNorm"
        assert norm._forward_method.__name__ == "forward_oot"
        config.compilation_config.custom_ops.remove("+rms_norm")
        assert RMSNorm(16)._forward_method.__name__ != "forward_oot"
        with custom_ops_forced(True):  # e.g. an eager drafter next to a compiled target
            assert RMSNorm(16)._forward_method.__name__ == "forward_oot"
            assert SiluAndMul()._forward_method.__name__ == "forward_oot"
        assert RMSNorm(16)._forward_method.__name__ != "forward_oot"


# --------------------------------------------------------------------------- GPU, real shapes
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 5, 80, 512])
def test_real_shapes_gpu(dtype, tokens):
    from specdec_plugin.ops.activation.triton import silu_and_mul
    from specdec_plugin.ops.rms_norm.triton import rms_norm
    from specdec_plugin.ops.rotary.triton import apply_rotary

    dev = "cuda"
    x, res = randn(tokens, 4096, dtype=dtype, device=dev), randn(tokens, 4096, dtype=dtype,
                                                                  device=dev)
    w = (1 + 0.1 * torch.randn(4096, device=dev)).to(dtype)
    torch.testing.assert_close(rms_norm(x, w, 1e-5), norm_ref.rms_norm(x, w, 1e-5), **tol(dtype))
    got, want = rms_norm(x, w, 1e-5, res), norm_ref.rms_norm(x, w, 1e-5, res)
    torch.testing.assert_close(got[0], want[0], **tol(dtype))
    assert torch.equal(got[1], want[1])  # one fp32 add, one rounding: exact

    gate_up = randn(tokens, 2 * 14336, dtype=dtype, device=dev) * 3
    torch.testing.assert_close(silu_and_mul(gate_up), act_ref.silu_and_mul(gate_up), **tol(dtype))

    for is_neox in (True, False):
        qkv, q, k, cache, positions = qkv_case(tokens, 32, 8, 128, 4096, 128, dtype, dev)
        want = qkv.clone()
        rope_ref.apply_rotary(positions, want[:, :4096], want[:, 4096:5120], cache, 128, 128,
                              is_neox)
        apply_rotary(positions, q, k, cache, 128, 128, is_neox)
        # The GPU compiler contracts one product into its sum (an FMA), so an element can
        # differ from the reference by one rounding; near zero that is a large relative error
        # (seen on an H100: 18 of 3.1M elements, at most 2e-3 absolute). Bound the error
        # relative to the norm, and each element by two units of the dtype at its magnitude.
        diff = (qkv.float() - want.float())
        assert diff.norm() / want.float().norm() < {torch.bfloat16: 1e-2, torch.float16: 1e-3}[dtype]
        ulp = torch.finfo(dtype).eps * want.float().abs().clamp(min=1.0)
        assert bool((diff.abs() <= 2 * ulp).all()), float((diff.abs() / ulp).max())
