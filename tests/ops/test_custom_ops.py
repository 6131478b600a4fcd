"""``ops/custom_ops.py``: after ``register_custom_ops``, vLLM's constructors build our subclasses,
their ``forward_oot`` equals vLLM's ``forward_native`` (torch provider), fallbacks included, and
each registered class runs the kernels of the providers it was registered with (passed down,
not read from module state)."""
from __future__ import annotations

import pytest
import torch

from tests.ops.layers import qkv_case


@pytest.fixture
def registry_restored(vllm_config):
    """Whatever a test registers is undone afterwards."""
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.rotary_embedding import _ROPE_DICT

    before, ropes_before = dict(op_registry_oot), dict(_ROPE_DICT)
    yield
    op_registry_oot.clear()
    op_registry_oot.update(before)
    _ROPE_DICT.clear()  # get_rope caches layers: drop the ones built as ours
    _ROPE_DICT.update(ropes_before)


@pytest.fixture
def registered(registry_restored):
    from specdec_plugin.ops import custom_ops

    return custom_ops.register_custom_ops(("torch",))


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


def test_layers_run_the_providers_they_were_registered_with(registry_restored):
    """Providers travel with the registered class: a later registration with other providers
    changes the layers built after it, not those built before, and leaves no module state."""
    from vllm.model_executor.layers.layernorm import RMSNorm

    from specdec_plugin.ops import custom_ops
    from specdec_plugin.ops.registry import get_kernel

    registered = custom_ops.register_custom_ops(("torch",))
    before = RMSNorm(16)
    # Other providers: every class is registered again, for the layers built from now on.
    assert custom_ops.register_custom_ops(("triton",)) == registered
    after = RMSNorm(16)
    assert type(before).kernel_providers == ("torch",)
    assert type(after).kernel_providers == ("triton",)
    assert before._specdec_kernel is get_kernel("rms_norm", ("torch",))
    assert after._specdec_kernel is get_kernel("rms_norm", ("triton",))
    assert not hasattr(custom_ops, "_providers")


def test_custom_ops_switch_applies_to_our_layers(registered):
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.layernorm import RMSNorm

    config = VllmConfig(compilation_config=CompilationConfig(custom_ops=["none", "+rms_norm"]))
    with set_current_vllm_config(config):
        norm = RMSNorm(16)
        assert type(norm).__name__ == "SpecDecRMSNorm"
        assert norm._forward_method.__name__ == "forward_oot"
        config.compilation_config.custom_ops.remove("+rms_norm")
        assert RMSNorm(16)._forward_method.__name__ != "forward_oot"

