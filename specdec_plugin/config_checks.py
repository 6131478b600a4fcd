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
    # Tensor, pipeline and data parallel go through vLLM's own distributed engine on every
    # device (CPU: gloo; CUDA: NCCL); vLLM itself checks the target's head counts, and
    # _check_draft_sharding the drafter's.
    parallel = config.parallel_config
    spec = config.speculative_config
    if spec is not None and parallel.pipeline_parallel_size > 1:
        # vLLM's V1 model runner (the one this platform runs) builds the drafter on the last
        # stage only, then reads it on every stage and miscounts the earlier stages' tokens;
        # vLLM refuses EAGLE-family drafters under PP itself (they do not implement SupportsPP).
        raise SpecDecConfigError(
            f"pipeline_parallel_size={parallel.pipeline_parallel_size} with speculative_config."
            f"method={spec.method!r}: vLLM 0.26's V1 model runner cannot speculate across "
            f"pipeline stages. Fix: shard with tensor_parallel_size instead (speculation works "
            f"there), or drop speculative_config to keep pipeline parallelism."
        )


def _check_draft_sharding(config: "VllmConfig", device: "DeviceLayer") -> None:
    # Caught here, in the user's process, instead of in every worker after the engine started.
    spec = config.speculative_config
    if spec is None or spec.draft_model_config is None or spec.draft_parallel_config is None:
        return
    target_tp = config.parallel_config.tensor_parallel_size
    draft_tp = spec.draft_parallel_config.tensor_parallel_size
    if spec.method == "draft_model" and draft_tp != target_tp:
        # vLLM's V1 draft-model proposer refuses it (draft_model.py: ranks would share one
        # compile cache for a drafter that only some of them run).
        raise SpecDecConfigError(
            f"speculative_config.draft_tensor_parallel_size={draft_tp} with tensor_parallel_size="
            f"{target_tp}: vLLM 0.26 runs a draft model only at the target's tensor parallel size. "
            f"Fix: set draft_tensor_parallel_size={target_tp} (or leave it unset)."
        )
    draft = spec.draft_model_config.hf_text_config
    sizes = {name: getattr(draft, name, None)
             for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size")}
    uneven = {name: size for name, size in sizes.items() if size and size % draft_tp and
              not (name == "num_key_value_heads" and draft_tp % size == 0)}  # KV heads may replicate
    if uneven:
        shown = ", ".join(f"{name}={size}" for name, size in uneven.items())
        raise SpecDecConfigError(
            f"speculative_config.model={spec.draft_model_config.model!r} has {shown}, which "
            f"does not split over tensor_parallel_size={draft_tp}. Fix: use a draft model whose "
            f"heads and MLP width divide by {draft_tp}, a tensor_parallel_size that divides them, "
            f"or method='ngram' / 'suffix', which have no drafter weights to split."
        )


def _check_sync_debug(config: "VllmConfig", device: "DeviceLayer") -> None:
    # Read by the workers after start-up (worker/sync_debug.py); a bad value is named here,
    # before any weight is read, not after the engine has started.
    from specdec_plugin import envs

    try:
        envs.sync_debug()
    except ValueError as exc:
        raise SpecDecConfigError(str(exc)) from None


CHECKS: dict[str, Callable[["VllmConfig", "DeviceLayer"], None]] = {
    "device_present": _check_device_present,
    "dtype": _check_dtype,
    "architecture": _check_architecture,
    "quantization": _check_quantization,
    "kv_cache_dtype": _check_kv_cache_dtype,
    "parallelism": _check_parallelism,
    "draft_sharding": _check_draft_sharding,
    "sync_debug": _check_sync_debug,
}


def validate(config: "VllmConfig", device: "DeviceLayer") -> None:
    if config.model_config is None:
        return
    for check in CHECKS.values():
        check(config, device)
