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
    # Linear layers and the LM head through oneDNN on weights packed once at load (patch P11,
    # ops/linear): torch's F.linear reads the unpacked weights at about half the rate.
    kernel_providers: ClassVar[tuple[str, ...]] = ("cpp", "onednn", "torch")
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
        from specdec_plugin.patches import cpu_linear, cpu_streams

        cpu_streams.apply()
        cpu_linear.apply(self.kernel_providers, self.linear_weight_dtype)

    def linear_weight_dtype(self, model_dtype: torch.dtype) -> torch.dtype | None:
        """The dtype P11 packs a linear layer's (or the LM head's) weight in, or None to leave
        it to vLLM's F.linear. Logged once per model dtype.

        float32 stays float32 by default: bfloat16 would halve the bytes a decode step reads
        (measured 1.3x faster again than packed float32 in the engine, BENCHMARKS.md) but
        oneDNN then rounds the activations to bfloat16 too, so greedy text is no longer the
        float32 model's the user asked for, and it rounds each product's result to bfloat16,
        where oneDNN's summation order differs between 1 and 1+K rows: speculative greedy
        output then differs from non-speculative (measured, EAGLE-3 at batch 1). So bfloat16
        is never chosen for a float32 model; ``SPECDEC_CPU_LINEAR=bf16`` opts in, with a
        warning."""
        choice = envs.cpu_linear()
        key = (model_dtype, choice)
        if key in _linear_choices:
            return _linear_choices[key]
        from specdec_plugin.log import init_logger  # not at import: detection must stay cheap
        from specdec_plugin.ops.linear import onednn

        logger = init_logger(__name__)
        if choice == "torch":
            dtype, why = None, "SPECDEC_CPU_LINEAR=torch"
        elif "onednn" not in self.kernel_providers or not onednn.available():
            dtype, why = None, "this torch has no oneDNN linear"
        elif choice == "bf16":
            native = bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())
            dtype, why = torch.bfloat16, ("SPECDEC_CPU_LINEAR=bf16; the CPU has native bf16"
                                          if native else "SPECDEC_CPU_LINEAR=bf16, but this CPU "
                                          "has no native bf16 (oneDNN emulates it: slower)")
        elif choice == "fp32":
            dtype, why = torch.float32, "SPECDEC_CPU_LINEAR=fp32"
        elif model_dtype in (torch.float32, torch.bfloat16):
            dtype, why = model_dtype, "the model's dtype (SPECDEC_CPU_LINEAR=auto)"
        else:
            dtype, why = None, f"oneDNN packing is float32/bfloat16 only, the model is {model_dtype}"
        _linear_choices[key] = dtype
        if dtype == torch.bfloat16 and model_dtype == torch.float32:
            logger.warning("SPECDEC_CPU_LINEAR=bf16 on a float32 model: linear layers round to "
                           "bfloat16, so greedy output differs from float32's, and with "
                           "speculation it can differ from the output without it (1 and 1+K "
                           "token products round differently). Unset it for lossless float32.")
        if dtype is None:
            logger.info("CPU linear layers and LM head: vLLM's F.linear (%s).", why)
        else:
            logger.info("CPU linear layers and LM head: oneDNN, %s weights packed once at load "
                        "(%s; measured 1.8x torch's F.linear at batch 1, 2.6x at batch 8).",
                        str(dtype).removeprefix("torch."), why)
        return dtype


_linear_choices: dict = {}


def _cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux reports them (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
