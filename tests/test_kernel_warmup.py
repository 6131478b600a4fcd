"""worker/kernel_warmup.py: at engine start every attention kernel variant serving launches
(query tile 1, verification tile, largest tile; split and unsplit) is launched once. Runs the
Triton kernel under its interpreter here (tests/conftest.py), with an H100's SM count so the
split heuristic plans as it would there."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specdec_plugin.attention.impl import SpecDecAttentionImpl
from specdec_plugin.ops.registry import get_kernel
from specdec_plugin.worker.kernel_warmup import compile_attention_variants

HQ, HKV, HEAD, BLOCK, BLOCKS = 8, 2, 32, 16, 6


def _runner(kv_cache: torch.Tensor, layers: int = 2):
    def layer():
        impl = SpecDecAttentionImpl(HQ, HEAD, HEAD ** -0.5, HKV)
        impl._attention = get_kernel("paged_attention", ("triton",))
        return SimpleNamespace(impl=impl, kv_cache=kv_cache, dtype=torch.float32)

    context = {f"model.layers.{i}.attn": layer() for i in range(layers)}
    context["not_attention"] = SimpleNamespace(weight=torch.zeros(1))
    return SimpleNamespace(compilation_config=SimpleNamespace(static_forward_context=context),
                           model_config=SimpleNamespace(max_model_len=BLOCK * BLOCKS,
                                                        dtype=torch.float32))


def test_every_tile_class_is_launched_split_and_unsplit(monkeypatch):
    from specdec_plugin.ops.paged_attention import triton as kernels
    from tests.ops.providers import small_shape_device

    device = small_shape_device()
    monkeypatch.setattr(kernels, "_device_index", lambda device: 0)
    monkeypatch.setattr(kernels, "_sm_count", lambda device_index: 132)
    plans = []
    launch_plan = kernels._launch_plan
    monkeypatch.setattr(kernels, "_launch_plan",
                        lambda *args: plans.append(launch_plan(*args)) or plans[-1])
    kv_cache = torch.rand(2, BLOCKS, BLOCK, HKV, HEAD, device=device) + 0.5
    before = kv_cache.clone()

    launches = compile_attention_variants(_runner(kv_cache))

    largest = 128 // 4  # rows per tile over a group of 4 query heads
    assert kernels.variant_query_lengths(HQ, HKV) == (1, 2, largest)
    assert launches == 6  # one layer shape (the second layer is the same): 3 tiles x 2
    assert {(p.block_q, p.num_splits > 1) for p in plans} == {
        (b, split) for b in (1, 8, largest) for split in (False, True)}
    assert torch.equal(kv_cache, before)  # reads the cache, writes nothing to it


def test_layers_without_our_attention_or_cache_are_skipped():
    runner = _runner(torch.tensor([]))  # before the KV cache is bound
    assert compile_attention_variants(runner) == 0
