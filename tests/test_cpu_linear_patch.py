"""P11 (patches/cpu_linear.py) and the CPU device layer's choice of linear weight dtype, without
an engine: vLLM's two unquantized methods on small layers, the patch installed for the test only.

- A linear layer is packed at load, its weight's storage released, and its products match
  F.linear; bias passes through; two layers sharing one weight share one packing.
- The LM head (embedding method) is packed at its first product, not at load (input embeddings
  never multiply), keeps its weight (often the tied input embedding), and is packed again when
  its weight is replaced (tied late).
- The device layer's choice per weight: SPECDEC_CPU_LINEAR=auto sends bfloat16-valued weights
  to the cpp provider as bfloat16 and any other float32 weight to oneDNN float32; bf16w forces
  the cpp provider, bf16 / fp32 oneDNN, torch leaves vLLM's F.linear, anything else is an error.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdec_plugin.device.cpu import CpuDevice
from specdec_plugin.patches import cpu_linear


@pytest.fixture
def patched(monkeypatch):
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    for cls in (UnquantizedLinearMethod, UnquantizedEmbeddingMethod):
        for name in ("process_weights_after_loading", "apply"):
            monkeypatch.setattr(cls, name, getattr(cls, name))  # restored after the test
    monkeypatch.setattr(cpu_linear, "_state", {})
    monkeypatch.setattr("specdec_plugin.device.cpu._linear_choices", set())
    monkeypatch.delenv("SPECDEC_CPU_LINEAR", raising=False)
    cpu_linear.apply(CpuDevice().linear_packing)
    return UnquantizedLinearMethod(), UnquantizedEmbeddingMethod()


def _weight(n, k, g, bf16_values):
    w = torch.randn(n, k, generator=g) * k ** -0.5
    return w.bfloat16().float() if bf16_values else w


def _layer(n, k, seed, bf16_values=True):
    g = torch.Generator().manual_seed(seed)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(_weight(n, k, g, bf16_values), requires_grad=False)
    return layer, torch.randn(3, k, generator=g)


def _provider(layer):
    packed, _ = layer.weight.__dict__[cpu_linear._ATTR]
    return packed.provider, packed.dtype


@pytest.mark.parametrize("bf16_values,want", [(True, ("cpp", torch.bfloat16)),
                                              (False, ("onednn", torch.float32))])
def test_linear_layer_packed_at_load_and_released(patched, bf16_values, want):
    method, _ = patched
    layer, x = _layer(96, 64, seed=0, bf16_values=bf16_values)
    original = layer.weight.detach().clone()
    method.process_weights_after_loading(layer)
    assert _provider(layer) == want
    assert layer.weight.shape == (0, 64)  # released: the packed copy is the only one
    bias = torch.randn(96)
    for rows in (x[:1], x):  # one token (decode) and several (verification, batches)
        torch.testing.assert_close(method.apply(layer, rows, bias), F.linear(rows, original, bias),
                                   rtol=1e-5, atol=1e-5)


def test_layers_sharing_a_weight_share_its_packing(patched):
    method, _ = patched
    first, x = _layer(64, 32, seed=3)
    second = torch.nn.Module()
    second.weight = first.weight
    original = first.weight.detach().clone()
    method.process_weights_after_loading(first)
    method.process_weights_after_loading(second)  # finds the packing, not the released storage
    for layer in (first, second):
        torch.testing.assert_close(method.apply(layer, x), F.linear(x, original), rtol=1e-5,
                                   atol=1e-5)


def test_lm_head_packed_at_first_product_and_after_retying(patched):
    _, method = patched
    head, x = _layer(200, 64, seed=1)
    method.process_weights_after_loading(head)
    assert cpu_linear._ATTR not in head.weight.__dict__  # could be an input embedding
    torch.testing.assert_close(method.apply(head, x), F.linear(x, head.weight), rtol=1e-5,
                               atol=1e-5)
    assert head.weight.shape == (200, 64)  # kept: an LM head is often the tied embedding
    first = head.weight.__dict__[cpu_linear._ATTR]
    other, _ = _layer(200, 64, seed=2)
    head.weight = other.weight  # tied after packing: the old packing must not be used
    torch.testing.assert_close(method.apply(head, x), F.linear(x, other.weight), rtol=1e-5,
                               atol=1e-5)
    assert head.weight.__dict__[cpu_linear._ATTR] is not first


@pytest.mark.parametrize("onednn_bf16", [True, False])
@pytest.mark.parametrize("setting,dtype,bf16_values,want", [
    ("auto", torch.float32, True, ("cpp", torch.bfloat16)),
    ("auto", torch.bfloat16, True, ("cpp", torch.bfloat16)),
    ("auto", torch.float32, False, ("onednn", torch.float32)),
    ("auto", torch.float16, True, None),
    ("bf16w", torch.float32, False, ("cpp", torch.bfloat16)),
    ("fp32", torch.float32, True, ("onednn", torch.float32)),
    ("fp32", torch.bfloat16, True, ("onednn", torch.float32)),
    ("bf16", torch.float32, True, ("onednn", torch.bfloat16)),
    ("torch", torch.float32, True, None)])
def test_device_layer_choice(monkeypatch, setting, dtype, bf16_values, want, onednn_bf16):
    """The same choices whether or not this CPU's oneDNN has a bfloat16 linear, except that
    asking for oneDNN bfloat16 where it has none is an error that names the setting."""
    from specdec_plugin.ops.linear import onednn

    monkeypatch.setenv("SPECDEC_CPU_LINEAR", setting)
    monkeypatch.setattr("specdec_plugin.device.cpu._linear_choices", set())
    monkeypatch.setattr(onednn, "supports", lambda dt: dt == torch.float32 or onednn_bf16)
    weight = _weight(8, 16, torch.Generator().manual_seed(4), bf16_values).to(dtype)
    if want == ("onednn", torch.bfloat16) and not onednn_bf16:
        with pytest.raises(RuntimeError, match="SPECDEC_CPU_LINEAR=bf16w"):
            CpuDevice().linear_packing(weight)
        return
    assert CpuDevice().linear_packing(weight) == want


@pytest.mark.parametrize("onednn_bf16,want", [(True, ("onednn", torch.bfloat16)),
                                              (False, ("onednn", torch.float32))])
def test_bfloat16_weights_without_the_cpp_kernel(monkeypatch, onednn_bf16, want):
    """With no cpp kernel built, bfloat16 weights go to oneDNN in bfloat16 where it has that
    path, else in float32 (exact for bfloat16 values) rather than failing at load."""
    from specdec_plugin.ops.linear import cpp, onednn

    monkeypatch.setenv("SPECDEC_CPU_LINEAR", "auto")
    monkeypatch.setattr("specdec_plugin.device.cpu._linear_choices", set())
    monkeypatch.setattr(cpp, "available", lambda: False)
    monkeypatch.setattr(onednn, "supports", lambda dt: dt == torch.float32 or onednn_bf16)
    weight = _weight(8, 16, torch.Generator().manual_seed(6), True).bfloat16()
    assert CpuDevice().linear_packing(weight) == want


def test_bf16_exactness_is_read_from_the_values():
    from specdec_plugin.device.cpu import _bf16_exact

    w = _weight(8, 16, torch.Generator().manual_seed(5), bf16_values=True)
    assert _bf16_exact(w) and _bf16_exact(w.bfloat16())
    w[3, 7] = torch.nextafter(w[3, 7], torch.tensor(2.0))  # one value off the bfloat16 grid
    assert not _bf16_exact(w)


def test_device_layer_rejects_unknown_setting(monkeypatch):
    monkeypatch.setenv("SPECDEC_CPU_LINEAR", "int8")
    monkeypatch.setattr("specdec_plugin.device.cpu._linear_choices", set())
    with pytest.raises(ValueError, match="SPECDEC_CPU_LINEAR"):
        CpuDevice().linear_packing(torch.ones(2, 2))
