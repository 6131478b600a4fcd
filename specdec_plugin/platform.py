"""The vLLM platform: one class per device, all sharing ``SpecDecPlatform``'s behaviour and
reading their facts from the device layer.

vLLM resolves the name ``register()`` returned (``specdec_plugin.platform.CpuSpecDecPlatform``
and so on) through this module's ``__getattr__``, which builds the class for that device.

This module is imported while vLLM is still resolving ``current_platform``; it must not import
vLLM modules that read ``current_platform`` at import time (torch_utils, triton_utils,
_custom_ops, ...). Heavy imports stay inside methods.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, ClassVar

import torch
from vllm.platforms.interface import Platform, PlatformEnum

from specdec_plugin import envs
from specdec_plugin.device import DEVICES, get_device
from specdec_plugin.device.base import DeviceLayer

if TYPE_CHECKING:
    from vllm.config import VllmConfig

# Patch P12 (method "suffix" async-capable while SPECDEC_SUFFIX_ASYNC is on) in processes that
# build no engine config themselves but run VllmConfig.__post_init__ again (engine cores):
# vLLM imports this module before its config modules, so it is in place before any config.
from specdec_plugin.device import select_device_name  # noqa: E402
from specdec_plugin.patches import suffix_async_types as _p12  # noqa: E402

_p12.apply_in_this_process(get_device(select_device_name()).suffix_async_default)

ATTENTION_BACKEND = "specdec_plugin.attention.backend.SpecDecAttentionBackend"
# SPECDEC_FUSED_KV_WRITE=1: the new K/V written inside the attention kernel's launch.
FUSED_KV_ATTENTION_BACKEND = "specdec_plugin.attention.backend.SpecDecFusedKVAttentionBackend"
WORKER = "specdec_plugin.worker.worker.SpecDecWorker"


class SpecDecPlatform(Platform):
    _enum = PlatformEnum.OOT
    device: ClassVar[DeviceLayer]
    # Set per device from DeviceLayer.compile_backend (see _build).
    simple_compile_backend: str = "eager"

    # ---- facts ----
    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return list(self.device.supported_dtypes)

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return cls.device.device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return cls.device.total_memory(device_id)

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        return cls.device.memory_usage(device)

    @classmethod
    def num_compute_units(cls, device_id: int = 0) -> int:
        return cls.device.compute_units(device_id)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return cls.device.pin_memory

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        return cls.device.supports_graphs

    @classmethod
    def get_static_graph_wrapper_cls(cls) -> str:
        return "vllm.compilation.cuda_graph.CUDAGraphWrapper"

    @classmethod
    def opaque_attention_op(cls) -> bool:
        # Attention must be an opaque custom op: traced inline, Dynamo freezes the profiling
        # branch of the Python backend and the engine silently emits garbage.
        return True

    @classmethod
    def use_custom_allreduce(cls) -> bool:
        # vLLM's custom all-reduce asserts a CUDA-alike platform enum (custom_all_reduce.py)
        # and asks NVML through CudaPlatform for the topology; an out-of-tree platform has
        # neither, so tensor-parallel all-reduces go through NCCL (pynccl), graph-safe too.
        return False

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        from specdec_plugin.config_checks import require_supported_dtype

        require_supported_dtype(dtype, cls.device)

    # ---- device control ----
    @classmethod
    def import_kernels(cls) -> None:
        # None of vLLM's compute kernels run here; a device may still need vLLM's extension for
        # graph utilities its wrappers call (weak_ref_tensor in CUDAGraphWrapper).
        import importlib

        for module in cls.device.vllm_extensions:
            try:
                importlib.import_module(module)
            except ImportError as error:
                from specdec_plugin.log import init_logger

                init_logger(__name__).warning("specdec_plugin: could not import %s (%r)", module, error)

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        cls.device.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        cls.device.manual_seed_all(seed)

    @classmethod
    def synchronize(cls) -> None:
        cls.device.synchronize()

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return cls.device.communicator_cls

    # ---- attention ----
    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

        if selected_backend is not None and selected_backend != AttentionBackendEnum.CUSTOM:
            raise ValueError(
                f"attention_backend={selected_backend.name} is not available on specdec_plugin, "
                f"which runs its own attention. Fix: drop --attention-backend (or pass CUSTOM), "
                f"or set SPECDEC_DISABLE=1 to use vLLM's own platform and backends."
            )
        if attn_selector_config.use_mla:
            raise ValueError("specdec_plugin has no MLA attention; serve a model without MLA.")
        backend = cls._attention_backend()
        register_backend(AttentionBackendEnum.CUSTOM, backend)
        return backend

    @classmethod
    def _attention_backend(cls) -> str:
        if not envs.fused_kv_write():
            return ATTENTION_BACKEND
        from specdec_plugin.ops.registry import KERNELS

        provider = cls.device.kernel_providers[0]
        if provider not in KERNELS["paged_attention_write_kv"]:
            raise ValueError(
                f"SPECDEC_FUSED_KV_WRITE=1: the {cls.device.name} device's attention kernels "
                f"({provider}) have no fused KV write (ops/paged_attention: Triton only). Fix: "
                "unset SPECDEC_FUSED_KV_WRITE.")
        return FUSED_KV_ATTENTION_BACKEND

    # ---- configuration ----
    @classmethod
    def pre_register_and_update(cls, parser=None) -> None:
        # Model Runner V2 needs vLLM's compiled UVA ops; force V1 before VllmConfig exists.
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")

    @classmethod
    def check_and_update_config(cls, vllm_config: "VllmConfig") -> None:
        from specdec_plugin.config_checks import validate
        from specdec_plugin.config_defaults import apply_defaults

        validate(vllm_config, cls.device)
        resolved_async = vllm_config.scheduler_config.async_scheduling  # vLLM's choice
        apply_defaults(vllm_config, cls.device, worker_cls=WORKER)
        from specdec_plugin.adaptive.config import apply_adaptive
        from specdec_plugin.spec_decode.suffix_async_config import apply_suffix_async

        # After the defaults (they turn async scheduling off on devices without streams).
        apply_suffix_async(vllm_config, cls.device, bool(resolved_async))

        # After the defaults: the scheduler class follows the async-scheduling choice.
        apply_adaptive(vllm_config)

    @classmethod
    def verify_model_arch(cls, model_arch: str) -> None:
        pass  # checked with the whole model config in check_and_update_config


def platform_class_name(device_name: str) -> str:
    return f"{device_name.capitalize()}SpecDecPlatform"


_BUILT: dict[str, type[SpecDecPlatform]] = {}


def _build(device_name: str) -> type[SpecDecPlatform]:
    layer = get_device(device_name)
    attrs = {
        "device": layer,
        "device_name": layer.torch_device_type,
        "device_type": layer.torch_device_type,
        "dispatch_key": layer.dispatch_key,
        "dist_backend": layer.dist_backend,
        "device_control_env_var": layer.device_control_env_var,
        "ray_device_key": layer.ray_device_key,
        "simple_compile_backend": layer.compile_backend,
        "__module__": __name__,
    }
    name = platform_class_name(device_name)
    return type(name, (SpecDecPlatform,), attrs)


def __getattr__(name: str):
    for device_name in DEVICES:
        if name == platform_class_name(device_name):
            if device_name not in _BUILT:
                _BUILT[device_name] = _build(device_name)
            return _BUILT[device_name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
