"""SPECDEC_FUSED_KV_WRITE in a real engine (SmolLM2, fp32, CPU): the attention layers write the
new K/V inside the attention op, vLLM's separate KV update is skipped, and greedy output with
EAGLE-3 equals greedy output without speculation.

On the CPU the fused op exists only as the torch reference (the C++ attention has none, so the
platform refuses the variable there: ``test_the_cpu_kernels_refuse_it``). The engine test
therefore gives the CPU device the torch providers alone, in this process, for both engines;
what it checks is the wiring (backend choice, forward's slot mapping, vLLM skipping its own
update, the drafter's layers included), which is the same on every device. The Triton kernel
itself is compared with the separate ops in tests/ops/test_paged_attention_write_kv.py.
"""
from __future__ import annotations

import pytest

from tests.prompts import SPEC_PROMPTS
from tests.spec_configs import spec_config

pytestmark = pytest.mark.slow

PROMPTS = SPEC_PROMPTS[:4]
MAX_TOKENS = 24


def _greedy(llm) -> list[list[int]]:
    from vllm import SamplingParams

    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                                ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture
def counted_kernels(monkeypatch):
    """The torch providers alone, with the fused op's and the separate KV write's calls
    counted (get_kernel's cache is cleared so that the layers built now take these)."""
    from specdec_plugin.device.cpu import CpuDevice
    from specdec_plugin.ops.paged_attention import reference as attention
    from specdec_plugin.ops.registry import get_kernel
    from specdec_plugin.ops.reshape_and_cache import reference as kv_write

    calls = {"fused": 0, "separate": 0}

    def counting(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(CpuDevice, "kernel_providers", ("torch",))
    monkeypatch.setattr(attention, "paged_attention_write_kv",
                        counting("fused", attention.paged_attention_write_kv))
    monkeypatch.setattr(kv_write, "reshape_and_cache",
                        counting("separate", kv_write.reshape_and_cache))
    monkeypatch.setenv("SPECDEC_FUSED_KV_WRITE", "1")
    # vLLM keeps the attention backend it selected for the process's earlier engines (its
    # selector is cached): select afresh here, and again for the engines after this test.
    from vllm.v1.attention.selector import _cached_get_attn_backend

    _cached_get_attn_backend.cache_clear()
    get_kernel.cache_clear()
    yield calls
    _cached_get_attn_backend.cache_clear()
    get_kernel.cache_clear()


def test_fused_kv_write_is_lossless_with_eagle3(engines, smollm2_path, counted_kernels):
    with engines.one_off(smollm2_path, enable_prefix_caching=False) as llm:
        plain = _greedy(llm)
    # The reference fused op writes through the separate reference's function: count only
    # the separate writes vLLM's own update would have made.
    separate_in_plain = counted_kernels["separate"] - counted_kernels["fused"]
    fused_in_plain = counted_kernels["fused"]
    with engines.one_off(smollm2_path, enable_prefix_caching=False,
                         speculative_config=spec_config("eagle3", smollm2_path)) as llm:
        speculative = _greedy(llm)
    assert fused_in_plain > 0, counted_kernels
    assert separate_in_plain == 0, counted_kernels
    assert counted_kernels["fused"] > fused_in_plain  # the drafter's layers and verification
    assert speculative == plain


def test_the_cpu_kernels_refuse_it(monkeypatch):
    from specdec_plugin.platform import CpuSpecDecPlatform

    monkeypatch.setenv("SPECDEC_FUSED_KV_WRITE", "1")
    with pytest.raises(ValueError, match="SPECDEC_FUSED_KV_WRITE"):
        CpuSpecDecPlatform._attention_backend()
    monkeypatch.delenv("SPECDEC_FUSED_KV_WRITE")
    assert CpuSpecDecPlatform._attention_backend().endswith(".SpecDecAttentionBackend")
