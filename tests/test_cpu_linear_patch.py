"""P11 (patches/cpu_linear.py) and the CPU device layer's choice of linear weight dtype, without
an engine: vLLM's two unquantized methods on small layers, the patch installed for the test only.

- A linear layer is packed at load and its products match F.linear; bias passes through.
- The LM head (embedding method) is packed at its first product, not at load (input embeddings
  never multiply), and packed again when its weight is replaced (tied late).
- The device layer's choice: SPECDEC_CPU_LINEAR (auto keeps the model's dtype, torch leaves
  vLLM's F.linear, anything else is an error).
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
    monkeypatch.setattr("specdec_plugin.device.cpu._linear_choices", {})
    monkeypatch.delenv("SPECDEC_CPU_LINEAR", raising=False)
    device = CpuDevice()
    cpu_linear.apply(device.kernel_providers, device.linear_weight_dtype)
    return UnquantizedLinearMethod(), UnquantizedEmbeddingMethod()


def _layer(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(n, k, generator=g) * k ** -0.5,
                                      requires_grad=False)
    return layer, torch.randn(3, k, generator=g)


def test_linear_layer_packed_at_load(patched):
    method, _ = patched
    layer, x = _layer(96, 64, seed=0)
    method.process_weights_after_loading(layer)
    assert cpu_linear._ATTR in layer.__dict__
    bias = torch.randn(96)
    for rows in (x[:1], x):  # one token (decode) and several (verification, batches)
        torch.testing.assert_close(method.apply(layer, rows, bias), F.linear(rows, layer.weight, bias),
                                   rtol=1e-5, atol=1e-5)


def test_lm_head_packed_at_first_product_and_after_retying(patched):
    _, method = patched
    head, x = _layer(200, 64, seed=1)
    method.process_weights_after_loading(head)
    assert cpu_linear._ATTR not in head.__dict__  # could be an input embedding
    torch.testing.assert_close(method.apply(head, x), F.linear(x, head.weight), rtol=1e-5,
                               atol=1e-5)
    first = head.__dict__[cpu_linear._ATTR]
    other, _ = _layer(200, 64, seed=2)
    head.weight = other.weight  # tied after packing: the old packing must not be used
    torch.testing.assert_close(method.apply(head, x), F.linear(x, other.weight), rtol=1e-5,
                               atol=1e-5)
    assert head.__dict__[cpu_linear._ATTR] is not first


@pytest.mark.parametrize("setting,model,want", [
    ("auto", torch.float32, torch.float32), ("auto", torch.bfloat16, torch.bfloat16),
    ("auto", torch.float16, None), ("fp32", torch.bfloat16, torch.float32),
    ("bf16", torch.float32, torch.bfloat16), ("torch", torch.float32, None)])
def test_device_layer_choice(monkeypatch, setting, model, want):
    monkeypatch.setenv("SPECDEC_CPU_LINEAR", setting)
    monkeypatch.setattr("specdec_plugin.device.cpu._linear_choices", {})
    assert CpuDevice().linear_weight_dtype(model) == want


def test_device_layer_rejects_unknown_setting(monkeypatch):
    monkeypatch.setenv("SPECDEC_CPU_LINEAR", "int8")
    monkeypatch.setattr("specdec_plugin.device.cpu._linear_choices", {})
    with pytest.raises(ValueError, match="SPECDEC_CPU_LINEAR"):
        CpuDevice().linear_weight_dtype(torch.float32)
