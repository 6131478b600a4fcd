"""Validation of the user's configuration, run when vLLM builds the engine config: in the
process the user started, before any worker exists or any weight is read.

Every error names the field at fault and the fix. Each check is one function registered in
``CHECKS``; ``validate`` runs them all.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from specdec_plugin.device.base import DeviceLayer

OPT_OUT = "or set SPECDEC_DISABLE=1 to run on vLLM's own platform"


class SpecDecConfigError(ValueError):
    """A configuration specdec_plugin cannot run, with the fix in the message."""


def _check_device_present(config: "VllmConfig", device: "DeviceLayer") -> None:
    if not device.is_present():
        raise SpecDecConfigError(
            f"SPECDEC_DEVICE={device.name} but no {device.name} device is visible to this process. "
            f"Fix: unset SPECDEC_DEVICE to let specdec_plugin detect the device (it falls back to "
            f"the CPU), or install {device.install_hint} on a machine that has one."
        )


def require_supported_dtype(dtype, device: "DeviceLayer") -> None:
    if dtype not in device.supported_dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in device.supported_dtypes)
        raise SpecDecConfigError(
            f"dtype={str(dtype).removeprefix('torch.')} is not supported by specdec_plugin on "
            f"{device.name}. Fix: pass dtype= one of {names} (e.g. --dtype float32)."
        )


def _check_dtype(config: "VllmConfig", device: "DeviceLayer") -> None:
    require_supported_dtype(config.model_config.dtype, device)


def _check_architecture(config: "VllmConfig", device: "DeviceLayer") -> None:
    model = config.model_config
    arch = ", ".join(model.architectures or ["?"])
    # Each entry: (what the model has, why we cannot run it).
    unsupported = [
        (model.use_mla, "multi-head latent attention (MLA)"),
        (model.is_hybrid or model.is_attention_free, "state-space (Mamba) layers"),
        (model.is_multimodal_model, "a multimodal encoder"),
        (model.is_moe and device.name == "cpu", "mixture-of-experts layers (Triton-only in vLLM)"),
        (model.get_sliding_window() is not None, "sliding-window attention"),
        (getattr(model.hf_text_config, "attn_logit_softcapping", None), "attention logit soft-capping"),
        # "draft" is the runner type vLLM gives a draft model's own config.
        (model.runner_type not in ("generate", "draft"), f"runner={model.runner_type!r} (pooling)"),
    ]
    for present, feature in unsupported:
        if present:
            raise SpecDecConfigError(
                f"model={model.model!r} (architecture {arch}) uses {feature}, which specdec_plugin "
                f"cannot run yet. Fix: serve a dense decoder-only model (Llama, Qwen2, Qwen3, OPT, "
                f"Mistral families), {OPT_OUT}."
            )


def _check_quantization(config: "VllmConfig", device: "DeviceLayer") -> None:
    quant = config.model_config.quantization
    if quant is not None:
        raise SpecDecConfigError(
            f"quantization={quant!r}: specdec_plugin runs unquantized weights only (vLLM's "
            f"quantized kernels live in its compiled extension, which this platform does not use). "
            f"Fix: use an unquantized checkpoint, {OPT_OUT}."
        )


def _check_kv_cache_dtype(config: "VllmConfig", device: "DeviceLayer") -> None:
    cache_dtype = config.cache_config.cache_dtype
    if cache_dtype not in ("auto", None):
        raise SpecDecConfigError(
            f"kv_cache_dtype={cache_dtype!r} is not supported by specdec_plugin. "
            f"Fix: leave kv_cache_dtype at 'auto' (the model dtype)."
        )


def _check_parallelism(config: "VllmConfig", device: "DeviceLayer") -> None:
    parallel = config.parallel_config
    if device.name == "cpu" and parallel.world_size > 1:
        raise SpecDecConfigError(
            f"tensor_parallel_size={parallel.tensor_parallel_size}, pipeline_parallel_size="
            f"{parallel.pipeline_parallel_size}: specdec_plugin runs one worker on CPU. "
            f"Fix: use tensor_parallel_size=1 and pipeline_parallel_size=1."
        )


CHECKS: dict[str, Callable[["VllmConfig", "DeviceLayer"], None]] = {
    "device_present": _check_device_present,
    "dtype": _check_dtype,
    "architecture": _check_architecture,
    "quantization": _check_quantization,
    "kv_cache_dtype": _check_kv_cache_dtype,
    "parallelism": _check_parallelism,
}


def validate(config: "VllmConfig", device: "DeviceLayer") -> None:
    if config.model_config is None:
        return
    for check in CHECKS.values():
        check(config, device)
