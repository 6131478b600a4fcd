"""What the worker takes off the KV cache for memory vLLM's profile does not see
(specdec_plugin/worker/memory_accounting.py), with fakes for the runner and the device."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.config import CUDAGraphMode
from vllm.v1.kv_cache_interface import FullAttentionSpec

from specdec_plugin.attention.backend import _bound
from specdec_plugin.attention.metadata import SpecDecAttentionMetadataBuilder
from specdec_plugin.worker.memory_accounting import (
    counted_by_startup_plan,
    kv_cache_bytes_after,
    memory_outside_profile,
    reserve_attention_workspaces,
)


# ---- item 2: the attention workspace is reserved before the profile pass ----

class _Layer:
    def __init__(self, builder, num_heads):
        self._builder, self.num_heads = builder, num_heads

    def get_attn_backend(self):
        return SimpleNamespace(get_builder_cls=lambda: self._builder)


def test_workspaces_are_reserved_once_per_group_with_the_builders_arguments(monkeypatch):
    from specdec_plugin.ops import registry

    calls = []
    monkeypatch.setattr(registry, "get_kernel",
                        lambda name, providers: (lambda *args: calls.append((name, providers,
                                                                             args)) or 0))
    ours = _bound(SpecDecAttentionMetadataBuilder, ("triton", "torch"))
    vllms = type("VllmBuilder", (), {})  # vLLM's builders have no workspace to reserve
    target = FullAttentionSpec(block_size=16, num_kv_heads=3, head_size=64,
                               dtype=torch.bfloat16)
    drafter = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64,
                                dtype=torch.bfloat16)
    layers = {"t.0": _Layer(ours, 9), "t.1": _Layer(ours, 9), "d.0": _Layer(ours, 6),
              "other.0": _Layer(vllms, 4)}
    specs = {"t.0": target, "t.1": target, "d.0": drafter, "other.0": target}
    config = SimpleNamespace(
        compilation_config=SimpleNamespace(static_forward_context=layers),
        scheduler_config=SimpleNamespace(max_num_seqs=128),
        speculative_config=SimpleNamespace(num_speculative_tokens=3),
        model_config=SimpleNamespace(max_model_len=2048))
    runner = SimpleNamespace(compilation_config=config.compilation_config, vllm_config=config,
                             device=torch.device("cpu"), get_kv_cache_spec=lambda: specs)

    assert reserve_attention_workspaces(runner) == 2
    cpu = torch.device("cpu")
    assert sorted(calls, key=str) == sorted([
        ("paged_attention_workspace", ("triton", "torch"),
         (128, (1, 4), 9, 3, 64, 2048, torch.bfloat16, cpu)),
        ("paged_attention_workspace", ("triton", "torch"),
         (128, (1, 4), 6, 2, 64, 2048, torch.bfloat16, cpu)),
    ], key=str)


# ---- items 1 and 3: graphs ----

class _Runner:
    def __init__(self, estimate, drafter_bytes):
        self.estimate, self.profiled = estimate, 0
        self.drafter = SimpleNamespace(reserve_graph_memory=lambda measure: drafter_bytes)

    def profile_cudagraph_memory(self):
        self.profiled += 1
        return self.estimate


def _worker(mode=CUDAGraphMode.FULL_AND_PIECEWISE, graphs=True, eager=False):
    config = SimpleNamespace(
        model_config=SimpleNamespace(enforce_eager=eager),
        compilation_config=SimpleNamespace(cudagraph_mode=mode))
    return SimpleNamespace(vllm_config=config, model_runner=_Runner(700, 300),
                           device_layer=SimpleNamespace(supports_graphs=graphs))


@pytest.fixture(autouse=True)
def vllm_reads_the_environment():
    """vLLM caches its environment variables once an engine core starts in this process
    (``enable_envs_cache``) until that engine is cleaned up; an in-process engine of an earlier
    test not yet collected then hid these tests' ``setenv`` (seen once in a full CI run:
    ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0`` read as 1). The worker reads the variable
    before its own engine enables the cache, as vLLM's do."""
    from vllm import envs

    envs.disable_envs_cache()


@pytest.fixture
def oot_platform(monkeypatch):
    """An out-of-tree platform: vLLM did not estimate graph memory."""
    import vllm.platforms

    monkeypatch.setattr(vllm.platforms, "current_platform",
                        SimpleNamespace(is_cuda_alike=lambda: False))


def test_graph_estimate_and_drafter_reservation_are_held_back(oot_platform, monkeypatch):
    monkeypatch.setenv("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1")
    worker = _worker()
    outside = memory_outside_profile(worker)
    assert outside == {"target_graphs": 700, "drafter_graphs": 300}
    assert worker.model_runner.profiled == 1
    assert worker.cudagraph_memory_estimate == 700  # vLLM's warm-up log compares with it
    assert kv_cache_bytes_after(10_000, outside) == 9_000
    assert kv_cache_bytes_after(500, outside) == 0


def test_vllms_switch_turns_the_graph_estimate_off(oot_platform, monkeypatch):
    monkeypatch.setenv("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "0")
    assert memory_outside_profile(_worker())["target_graphs"] == 0


@pytest.mark.parametrize("worker", [
    _worker(mode=CUDAGraphMode.NONE), _worker(graphs=False), _worker(eager=True)],
    ids=["no-graph-mode", "device-without-graphs", "enforce-eager"])
def test_no_graph_estimate_without_graphs(oot_platform, worker):
    assert memory_outside_profile(worker)["target_graphs"] == 0
    assert worker.model_runner.profiled == 0


def test_no_second_estimate_where_vllm_made_one(monkeypatch):
    import vllm.platforms

    monkeypatch.setattr(vllm.platforms, "current_platform",
                        SimpleNamespace(is_cuda_alike=lambda: True))
    worker = _worker()
    assert memory_outside_profile(worker)["target_graphs"] == 0
    assert worker.model_runner.profiled == 0


def test_a_failing_graph_estimate_leaves_serving_as_before(oot_platform, monkeypatch):
    worker = _worker()

    def broken():
        raise RuntimeError("capture failed")

    monkeypatch.setattr(worker.model_runner, "profile_cudagraph_memory", broken)
    assert memory_outside_profile(worker) == {"target_graphs": 0, "drafter_graphs": 300}


def test_a_startup_plan_size_still_loses_the_drafter_graphs(oot_platform):
    worker = _worker()
    assert memory_outside_profile(worker, counted_by_startup_plan(True)) == {
        "drafter_graphs": 300}
    assert worker.model_runner.profiled == 0  # the plan skips vLLM's estimate: so do we
    assert counted_by_startup_plan(False) == ()
