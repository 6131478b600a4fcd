"""Device memory the plugin uses that vLLM's start-up profile does not see, taken off the KV cache.

How vLLM 0.26 sizes the KV cache (``Worker.determine_available_memory``, gpu_worker.py:448-607):

    KV bytes = gpu_memory_utilization x total
               - weights - torch peak of one profile pass (``profile_run``: a forward at
                 max_num_batched_tokens, the drafter's ``dummy_run``, a sampler pass)
               - non-torch growth during it
               - the CUDA-graph estimate

The graph estimate is ``GPUModelRunner.profile_cudagraph_memory`` (gpu_model_runner.py:6576):
with a minimal KV cache it captures two graphs per mode into a throwaway pool, takes the first
as the shared part and the second as the per-graph cost, and extrapolates to every capture
size; ``compile_or_warm_up_model`` then captures for real (``capture_model``) and logs actual
against estimated. Everything not there by the end of the profile and not in that estimate
must fit in the ``1 - gpu_memory_utilization`` that is left. On our platform three things
were not counted:

1. vLLM runs the graph estimate only where ``current_platform.is_cuda_alike()`` (CUDA, ROCm);
   an out-of-tree platform is not, so our target's FULL and PIECEWISE graphs (and the extra
   query-length graphs of adaptive drafting, adaptive/graphs.py) were outside the budget. We
   run vLLM's own estimate where our device has graphs, under vLLM's switch
   ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, and store it where vLLM's warm-up log reads it.
2. Our attention kernel's split-KV workspace (``paged_attention_workspace``) is allocated when
   vLLM builds the attention metadata builders, with the KV cache, after sizing. The runner
   reserves it at the start of ``profile_run`` (``reserve_attention_workspaces``), so the
   profile's torch peak includes it and the builders later find it large enough.
3. Our drafter graphs, recorded lazily while serving: a reservation measured here
   (spec_decode/graph_memory.py) and enforced by the drafter at each recording.

A KV size the user fixed (``kv_cache_memory_bytes``) is taken as given, as vLLM does. A size
vLLM's startup plan applied (opt-in) still has the drafter graphs taken off.
"""
from __future__ import annotations

from collections import defaultdict

import torch
from vllm import envs as vllm_envs
from vllm.config import CUDAGraphMode

from specdec_plugin.log import init_logger

logger = init_logger(__name__)


def reserve_attention_workspaces(runner) -> int:
    """Reserve every attention kernel workspace the builders will ask for, now (before the
    profile pass). Calls the builder's own reservation with the arguments each builder will
    have (one per backend and KV spec, as vLLM groups layers), so the sizes cannot drift.
    Returns the number of reservations made."""
    from vllm.v1.kv_cache_interface import AttentionSpec

    layers = runner.compilation_config.static_forward_context
    groups: dict[tuple, list[str]] = defaultdict(list)
    for name, spec in runner.get_kv_cache_spec().items():
        layer = layers.get(name)
        if layer is None or not isinstance(spec, AttentionSpec) or not hasattr(
                layer, "get_attn_backend"):
            continue
        builder = layer.get_attn_backend().get_builder_cls()
        if hasattr(builder, "_reserve_kernel_workspace"):  # ours; vLLM's builders have none
            groups[(builder, spec)].append(name)
    for (builder, spec), names in groups.items():
        # The builder reads only class-level settings (its kernel providers) here.
        builder._reserve_kernel_workspace(builder, spec, names, runner.vllm_config,
                                          runner.device)
    return len(groups)


def measure_peak(fn) -> int:
    """Peak device memory ``fn`` allocated above what was allocated before it."""
    torch.accelerator.synchronize()
    torch.accelerator.reset_peak_memory_stats()
    base = torch.accelerator.memory_allocated()
    fn()
    torch.accelerator.synchronize()
    return max(int(torch.accelerator.max_memory_allocated()) - int(base), 0)


def _target_graph_estimate(worker) -> int:
    """vLLM's own graph-memory estimate, where vLLM skipped it for our platform (item 1)."""
    from vllm.platforms import current_platform

    config = worker.vllm_config
    if (current_platform.is_cuda_alike()  # vLLM already counted it
            or not worker.device_layer.supports_graphs
            or config.model_config.enforce_eager
            or config.compilation_config.cudagraph_mode == CUDAGraphMode.NONE):
        return 0
    try:
        estimate = int(worker.model_runner.profile_cudagraph_memory())
    except Exception as exc:  # vLLM's code, run for a platform it was not written for
        # Its own cleanup ran (a finally there); serving works as before this estimate
        # existed. tests/gpu/test_serve_memory_gpu.py fails if the estimate is missing.
        logger.warning("specdec_plugin: vLLM's CUDA-graph memory estimate failed (%s: %s); "
                       "graph memory is not taken off the KV cache, lower "
                       "gpu_memory_utilization to make room", type(exc).__name__, exc)
        return 0
    # vLLM's warm-up compares the captured pool with this (gpu_worker.py:786-799).
    worker.cudagraph_memory_estimate = estimate
    if not vllm_envs.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS:
        logger.warning("specdec_plugin: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0: %.2f GiB "
                       "of CUDA graphs are not taken off the KV cache", estimate / 2**30)
        return 0
    return estimate


def _drafter_graph_reservation(worker) -> int:
    drafter = getattr(worker.model_runner, "drafter", None)
    reserve = getattr(drafter, "reserve_graph_memory", None)
    return int(reserve(measure_peak)) if reserve is not None else 0


# Each part: name -> function(worker) -> bytes outside the profile. Run in this order (the
# graph estimate sets up and tears down a minimal KV cache; the drafter's measurement needs
# none).
OUTSIDE_PROFILE = {
    "target_graphs": _target_graph_estimate,
    "drafter_graphs": _drafter_graph_reservation,
}


def memory_outside_profile(worker, counted: tuple[str, ...] = ()) -> dict[str, int]:
    """Bytes per part, for the parts not already ``counted``."""
    return {name: part(worker) for name, part in OUTSIDE_PROFILE.items() if name not in counted}


def counted_by_startup_plan(planned: bool) -> tuple[str, ...]:
    """The parts a KV size from vLLM's startup plan (``VLLM_ENABLE_STARTUP_PLAN=1``) already
    holds back: the boot that saved it subtracted the graphs it captured and the profile peak
    (which had our workspace), but never saw the drafter graphs recorded while serving."""
    return ("target_graphs",) if planned else ()


def kv_cache_bytes_after(available: int, outside: dict[str, int]) -> int:
    """The KV cache that fits once the parts outside the profile are held back."""
    return max(int(available) - sum(outside.values()), 0)
