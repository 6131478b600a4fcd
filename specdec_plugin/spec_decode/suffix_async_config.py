"""Whether method "suffix" runs under async scheduling (``SPECDEC_SUFFIX_ASYNC``).

vLLM decides it: while the variable is on, patch P12 (patches/suffix_async_types.py) counts
suffix among the methods vLLM resolves async scheduling for, as for ``ngram_gpu``: on by
default, an explicit ``async_scheduling=True`` accepted, an explicit ``False`` kept, and the
settings that go with it made (config/vllm.py:1059-1137). This module only adds, in the
platform's config hook, what the device layer changes afterwards: devices without streams
(the CPU) turn async scheduling off for every method (config_defaults.py); with
``SPECDEC_SUFFIX_ASYNC=force`` suffix decoding keeps vLLM's choice there, for tests (the
CPU's host stand-ins for streams and events run everything in program order).

The runner side (drafts made lazily) is spec_decode/suffix_async_runner.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from specdec_plugin import envs
from specdec_plugin.log import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from specdec_plugin.device.base import DeviceLayer

logger = init_logger(__name__)


def _is_suffix(vllm_config: "VllmConfig") -> bool:
    spec = vllm_config.speculative_config
    return spec is not None and spec.method == "suffix" and bool(spec.num_speculative_tokens)


def apply_suffix_async(vllm_config: "VllmConfig", device: "DeviceLayer",
                       resolved_by_vllm: bool) -> None:
    """After the device defaults; ``resolved_by_vllm``: async scheduling as vLLM left it,
    before those defaults. Idempotent (workers and engine processes run it again)."""
    if not _is_suffix(vllm_config):
        return
    scheduler = vllm_config.scheduler_config
    mode = envs.suffix_async(device.suffix_async_default)
    if mode == "force" and resolved_by_vllm and not scheduler.async_scheduling:
        scheduler.async_scheduling = True  # the device defaults turned it off (no streams)
    if mode != "0":
        logger.info_once(
            "specdec_plugin: suffix decoding %s (SPECDEC_SUFFIX_ASYNC=%s)",
            "runs under async scheduling: drafts are made lazily, steps that draft nothing "
            "do not wait for the device" if scheduler.async_scheduling
            else "stays without async scheduling (off for this device or by request)", mode)
