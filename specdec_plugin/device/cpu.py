"""The CPU: C++ attention kernels (csrc/cpu_attention.cpp), pure-torch references for the
rest, no graphs, no pinned memory, no async scheduling.

It runs with the normal (CUDA) vLLM and torch wheels on a machine without a GPU, where vLLM's
Triton kernels are placeholders and ``torch.cuda``/``torch.accelerator`` have no device.
"""
from __future__ import annotations

import os
from typing import ClassVar

import torch

from specdec_plugin import envs
from specdec_plugin.device.base import DeviceLayer


class CpuDevice(DeviceLayer):
    name: ClassVar[str] = "cpu"
    torch_device_type: ClassVar[str] = "cpu"
    dispatch_key: ClassVar[str] = "CPU"
    dist_backend: ClassVar[str] = "gloo"
    device_control_env_var: ClassVar[str] = "SPECDEC_CPU_VISIBLE_DEVICES"
    # Attention and the KV write in C++ (csrc/cpu_attention.cpp): the torch reference spends
    # more on per-layer indexing than on arithmetic here (BENCHMARKS.md, CPU step profile).
    kernel_providers: ClassVar[tuple[str, ...]] = ("cpp", "torch")
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16)
    install_hint: ClassVar[str] = "any torch build"
    sampler_warmup_max_rows: ClassVar[int | None] = 8
    process_env: ClassVar[dict[str, str]] = {
        # A process forked after torch ran multi-threaded CPU work inherits a dead OpenMP pool
        # and hangs at its first parallel op (seen: torch.zeros in InputBatch); spawn is clean.
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        # OpenMP threads that spin while waiting turn any oversubscription (the API server, a
        # tokenizer, another job) into a 100x slowdown: measured 40 ms against 0.4 ms for one
        # small matmul on 2 busy cores. Passive waiting costs nothing measurable when idle.
        "OMP_WAIT_POLICY": "PASSIVE",
    }

    @classmethod
    def is_present(cls) -> bool:
        return True

    def device_name(self, device_id: int = 0) -> str:
        return "cpu"

    def total_memory(self, device_id: int = 0) -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def memory_usage(self, device=None) -> float:
        # Resident set size of this process: what loading weights adds shows up here.
        with open("/proc/self/statm") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))

    def compute_units(self, device_id: int = 0) -> int:
        return envs.cpu_threads()

    def worker_device(self, local_rank: int) -> torch.device:
        return torch.device("cpu")

    def prepare_worker_process(self, workers_on_host: int = 1) -> None:
        # vLLM sets one thread for non-CPU platforms; our kernels want the cores, shared out
        # between the workers of one engine (tensor / pipeline / data parallel ranks), which
        # would otherwise each start a thread per core and fight over them.
        torch.set_num_threads(max(1, envs.cpu_threads() // max(1, workers_on_host)))
        # With a CUDA torch on a GPU-less machine torch.accelerator and CUDA streams/events
        # raise on first use, and the V1 runner calls them in construction, profiling, cleanup
        # and (EAGLE-family drafters) every step: patches P4 and P5, for this process's life.
        from specdec_plugin.patches import cpu_streams

        cpu_streams.apply()
