"""specdec_plugin: a speculative-decoding hardware platform for vLLM 0.26.0.

vLLM finds this package through the ``vllm.platform_plugins`` entry point ``specdec``, which
calls :func:`register`. vLLM calls it twice in every process, so it only reads the environment
and probes for devices cheaply: no imports of vLLM, no state.
"""
from __future__ import annotations

__version__ = "0.1.0"


def register() -> str | None:
    """Return the qualified name of the platform class for the device found, or None to opt out."""
    from specdec_plugin import envs

    if envs.disabled():
        return None
    from specdec_plugin.device import select_device_name
    from specdec_plugin.platform import platform_class_name

    return f"specdec_plugin.platform.{platform_class_name(select_device_name())}"
