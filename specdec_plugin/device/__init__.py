"""The device layer: everything that differs between the devices the plugin drives.

Each device is one file here holding one :class:`~specdec_plugin.device.base.DeviceLayer`
subclass; ``DEVICES`` maps its name to it, in detection order. Adding a device means one new
file and one line below; nothing else in the plugin names a device.
"""
from __future__ import annotations

import importlib
from functools import lru_cache

from specdec_plugin import envs

# name -> "module:class", in the order devices are detected (most specific first).
DEVICES: dict[str, str] = {
    "npu": "specdec_plugin.device.npu:NpuDevice",
    "cuda": "specdec_plugin.device.cuda:CudaDevice",
    "cpu": "specdec_plugin.device.cpu:CpuDevice",
}


def device_class(name: str):
    try:
        module, _, cls = DEVICES[name].partition(":")
    except KeyError:
        raise ValueError(
            f"SPECDEC_DEVICE={name!r} is not a device specdec_plugin knows; "
            f"use one of {', '.join(DEVICES)} or unset SPECDEC_DEVICE to detect one."
        ) from None
    return getattr(importlib.import_module(module), cls)


def select_device_name() -> str:
    """The forced device if ``SPECDEC_DEVICE`` is set, else the first device present."""
    forced = envs.forced_device()
    if forced is not None:
        device_class(forced)  # validates the name
        return forced
    for name in DEVICES:
        if device_class(name).is_present():
            return name
    return "cpu"


@lru_cache(maxsize=None)
def get_device(name: str):
    """The (single, per-process) device layer instance for ``name``."""
    return device_class(name)()
