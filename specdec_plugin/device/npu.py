"""Ascend NPUs through torch_npu (and triton-ascend for kernels).

Designed for, not yet run: no Ascend hardware was available to this project. The facts below
follow torch_npu's public API (``torch.npu`` mirrors ``torch.cuda``); treat this file as
untested until it has run on an NPU.
"""
from __future__ import annotations

import glob
import importlib.util
from typing import ClassVar

import torch

from specdec_plugin.device.base import DeviceLayer


class NpuDevice(DeviceLayer):
    name: ClassVar[str] = "npu"
    torch_device_type: ClassVar[str] = "npu"
    dispatch_key: ClassVar[str] = "PrivateUse1"
    dist_backend: ClassVar[str] = "hccl"
    device_control_env_var: ClassVar[str] = "ASCEND_RT_VISIBLE_DEVICES"
    ray_device_key: ClassVar[str] = "NPU"
    # triton-ascend compiles the same Triton kernels for the NPU.
    kernel_providers: ClassVar[tuple[str, ...]] = ("triton", "torch")
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16, torch.float32)
    supports_graphs: ClassVar[bool] = False  # ACL graphs: not wired up yet
    compiles_kernels_at_first_use: ClassVar[bool] = True  # triton-ascend (not run: no NPU here)
    pin_memory: ClassVar[bool] = True
    install_hint: ClassVar[str] = "torch_npu with the CANN toolkit"

    @classmethod
    def is_present(cls) -> bool:
        # Importing torch_npu patches torch; detection must not, so look for the package and
        # for the device nodes the Ascend driver creates.
        return importlib.util.find_spec("torch_npu") is not None and bool(glob.glob("/dev/davinci[0-9]*"))

    @staticmethod
    def _npu():
        import torch_npu  # noqa: F401  (registers torch.npu)

        return torch.npu

    def device_count(self) -> int:
        return self._npu().device_count()

    def device_name(self, device_id: int = 0) -> str:
        return self._npu().get_device_name(device_id)

    def total_memory(self, device_id: int = 0) -> int:
        return self._npu().get_device_properties(device_id).total_memory

    def memory_usage(self, device=None) -> float:
        npu = self._npu()
        npu.reset_peak_memory_stats(device)
        return float(npu.max_memory_allocated(device))

    def compute_units(self, device_id: int = 0) -> int:
        props = self._npu().get_device_properties(device_id)
        return getattr(props, "multi_processor_count", 1)

    def set_device(self, device: torch.device) -> None:
        self._npu().set_device(device)

    def manual_seed_all(self, seed: int) -> None:
        self._npu().manual_seed_all(seed)

    def synchronize(self) -> None:
        self._npu().synchronize()

    def worker_device(self, local_rank: int) -> torch.device:
        self._npu()
        return torch.device(f"npu:{local_rank}")

    def measures_memory(self) -> bool:
        return True
