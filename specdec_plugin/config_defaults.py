"""The engine settings the plugin decides for the user, applied in ``check_and_update_config``.

Called in the user's process when the engine config is built, and again in workers whenever
vLLM rebuilds a config (the drafter does); every step here is idempotent.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from specdec_plugin.log import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from specdec_plugin.device.base import DeviceLayer

logger = init_logger(__name__)

# Inductor fusion passes that call vLLM's compiled `_C` ops (absent here): always off.
_FUSION_PASSES = (
    "fuse_norm_quant", "fuse_act_quant", "fuse_attn_quant", "fuse_gemm_comms",
    "fuse_allreduce_rms", "enable_qk_norm_rope_fusion", "fuse_rope_kvcache_cat_mla",
    "fuse_act_padding", "fuse_mla_dual_rms_norm", "fuse_rope_kvcache",
    "fuse_qk_norm_rope_kvcache", "enable_sp",
)


def apply_process_env(device: "DeviceLayer") -> None:
    """The device layer's environment defaults, each only where the user set nothing."""
    for name, value in device.process_env.items():
        os.environ.setdefault(name, value)


def apply_defaults(config: "VllmConfig", device: "DeviceLayer", worker_cls: str) -> None:
    from vllm.config.compilation import CompilationMode, CUDAGraphMode

    apply_process_env(device)

    parallel = config.parallel_config
    if parallel.worker_cls == "auto":
        parallel.worker_cls = worker_cls

    compilation = config.compilation_config
    for flag in _FUSION_PASSES:
        if getattr(compilation.pass_config, flag, None):
            setattr(compilation.pass_config, flag, False)

    if not device.supports_graphs:
        # Eager PyTorch. On CPU torch.compile measured no gain with the "eager" backend, and
        # Inductor's CPU code (SmolLM2, 2 cores, 2026-11-24, FixFunctionalizationPass stubbed:
        # it needs vLLM's _C) decoded 6x slower than eager and took 74 s to compile: BENCHMARKS.md.
        compilation.mode = CompilationMode.NONE
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        compilation.cudagraph_capture_sizes = []
        compilation.max_cudagraph_capture_size = 0
        compilation.compile_sizes = []
        if config.scheduler_config.async_scheduling:
            logger.info("specdec_plugin: async scheduling is off on %s (no device streams).", device.name)
        config.scheduler_config.async_scheduling = False
        return
    if compilation.cudagraph_mode not in (CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE):
        # A device whose attention falls back to the torch reference (which syncs with the
        # host) cannot hold attention inside a full graph: keep graphs piecewise there.
        from specdec_plugin.ops.registry import has_graph_safe_kernel

        if not has_graph_safe_kernel("paged_attention", device.kernel_providers):
            logger.warning(
                "specdec_plugin: cudagraph_mode=%s needs a graph-safe attention kernel for %s; "
                "using PIECEWISE graphs (attention outside the graph).",
                compilation.cudagraph_mode.name, device.name,
            )
            compilation.cudagraph_mode = CUDAGraphMode.PIECEWISE

    from specdec_plugin.capture_sizes import apply_capture_sizes

    apply_capture_sizes(config)
