"""The CPU: C++ kernels for attention, the KV write, the linear layers and the norm / rotary /
activation ops (csrc/), pure-torch references for the rest, no graphs, no pinned memory, no
async scheduling.

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
    # RMSNorm, rotary and SiLU-and-mul too (csrc/cpu_layer_ops.cpp): one call per op per layer
    # instead of ~8-10 small torch ops, whose dispatch is most of their cost at batch 1.
    # Linear layers and the LM head on weights packed once at load (patch P11, ops/linear): our
    # C++ kernel on bfloat16 panels where the weights are bfloat16 values, oneDNN otherwise
    # (linear_packing); torch's F.linear reads the unpacked weights at about half the rate.
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
        # Deferred drafter KV sync (spec_decode/deferred_sync.py) by default here, where it was
        # measured (drafter time per plain step 2.96 -> 1.13 ms at batch 1); a user's setting
        # wins. CUDA sets it too (device/cuda.py); NPUs leave it off until it has run on one.
        "SPECDEC_DEFER_DRAFTER_SYNC": "1",
        # Observed step costs for n-gram (adaptive/observed_cost.py): the start-up table times
        # the forward pass alone, and on 2 cores a step's host work (scheduling, sampling,
        # input preparation) roughly doubles a batch-4 step. The table then overstates what
        # verifying drafts adds, and on the code-edit prompts at batch 4 the controller never
        # drafted (acceptance length 1.33 from three probes; static K 1.16-1.21x of plain). With
        # the correction it drafted as static K does there (1.12x and 1.17x in two runs), and
        # chose the same lengths as before at batch 1 (session 36, BENCHMARKS.md).
        # EAGLE-3 too: on chat at batch 8 the table alone drafted at 0.87-1.05x of plain
        # decoding (median 0.946 over five runs); corrected, 0.98-1.08x (median 1.023 over
        # five), the other cells within noise (session 39, BENCHMARKS.md).
        "SPECDEC_ADAPTIVE_OBSERVED_COST": "ngram,eagle3",
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
        cpu_linear.apply(self.linear_packing)

    def linear_packing(self, weight: torch.Tensor) -> tuple[str, torch.dtype] | None:
        """How P11 packs one linear layer's (or the LM head's) weight: ``(provider, dtype)``
        for ops/linear, or None to leave the layer to vLLM's F.linear. Each distinct choice is
        logged once.

        Default (``SPECDEC_CPU_LINEAR=auto``): a weight whose values are all bfloat16 (a
        bfloat16 checkpoint, loaded as float32 or bfloat16) goes to the ``cpp`` provider as
        bfloat16 panels widened to float32 in registers: the float32 product from half the
        bytes, and row invariant, so speculation stays lossless (BENCHMARKS.md: 2.3x oneDNN
        float32 at one token). Any other weight keeps oneDNN in its own dtype. oneDNN bfloat16
        (``SPECDEC_CPU_LINEAR=bf16``) is never chosen by itself: it rounds activations and
        results to bfloat16, in an order that differs between 1 and 1+K rows, so speculative
        greedy output drifts from non-speculative (measured, EAGLE-3 at batch 1)."""
        from specdec_plugin.ops.linear import cpp, onednn  # not at import: detection stays cheap

        choice = envs.cpu_linear()
        if choice == "torch":
            return self._log_linear(None, "SPECDEC_CPU_LINEAR=torch")
        if weight.dtype not in (torch.float32, torch.bfloat16):
            return self._log_linear(None, f"packing is float32/bfloat16 only, the weight is "
                                          f"{weight.dtype}")
        exact = _bf16_exact(weight)
        if choice == "bf16w":
            if not cpp.available():
                raise RuntimeError("SPECDEC_CPU_LINEAR=bf16w needs specdec_plugin._C with "
                                   "cpu_linear_packed: rebuild it (pip install -e .)")
            return self._log_linear(("cpp", torch.bfloat16), "SPECDEC_CPU_LINEAR=bf16w",
                                    warn=None if exact else (
                                        "SPECDEC_CPU_LINEAR=bf16w on weights that are not "
                                        "bfloat16 values: they are rounded to bfloat16, so "
                                        "greedy output differs from the model's own dtype."))
        if choice == "auto" and exact and cpp.available():
            return self._log_linear(("cpp", torch.bfloat16),
                                    "the weights are bfloat16 values; lossless: float32 "
                                    "activations and accumulation, row invariant")
        if not onednn.available():
            return self._log_linear(None, "this torch has no oneDNN linear")
        if choice == "bf16":
            if not onednn.supports(torch.bfloat16):
                raise RuntimeError(
                    "SPECDEC_CPU_LINEAR=bf16: oneDNN on this CPU has no bfloat16 linear (it "
                    "needs avx512bw/vl/dq or avx_ne_convert). Unset SPECDEC_CPU_LINEAR for the "
                    "lossless default, or set SPECDEC_CPU_LINEAR=bf16w for bfloat16 weights "
                    "through our C++ kernel.")
            native = bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())
            return self._log_linear(
                ("onednn", torch.bfloat16), "SPECDEC_CPU_LINEAR=bf16" + (
                    "; the CPU has native bf16" if native
                    else ", but this CPU has no native bf16 (oneDNN emulates it: slower)"),
                warn=None if weight.dtype == torch.bfloat16 else (
                    "SPECDEC_CPU_LINEAR=bf16 on a float32 model: linear layers round to "
                    "bfloat16, so greedy output differs from float32's, and with speculation "
                    "it can differ from the output without it (1 and 1+K token products round "
                    "differently). Unset it for lossless float32."))
        if choice == "fp32":
            return self._log_linear(("onednn", torch.float32), "SPECDEC_CPU_LINEAR=fp32")
        why = ("the weights are not bfloat16 values" if not exact
               else "specdec_plugin._C has no cpu_linear_packed (rebuild it)")
        if not onednn.supports(weight.dtype):
            # bfloat16 values are exact in float32: the same products, read at twice the bytes.
            return self._log_linear(("onednn", torch.float32),
                                    f"{why}; oneDNN on this CPU has no bfloat16 linear")
        return self._log_linear(("onednn", weight.dtype), f"the weight's dtype ({why})")

    @staticmethod
    def _log_linear(packing: tuple[str, torch.dtype] | None, why: str,
                    warn: str | None = None) -> tuple[str, torch.dtype] | None:
        if (packing, why) not in _linear_choices:
            _linear_choices.add((packing, why))
            from specdec_plugin.log import init_logger

            logger = init_logger(__name__)
            if warn:
                logger.warning(warn)
            if packing is None:
                logger.info("CPU linear layers and LM head: vLLM's F.linear (%s).", why)
            else:
                provider, dtype = packing
                logger.info("CPU linear layers and LM head: %s, %s weights packed once at "
                            "load (%s).", _PROVIDER_NAMES[provider],
                            str(dtype).removeprefix("torch."), why)
        return packing


_PROVIDER_NAMES = {"cpp": "our C++ kernel (csrc/cpu_linear_packed.cpp)", "onednn": "oneDNN"}
_linear_choices: set = set()  # the (packing, reason) pairs logged so far


def _bf16_exact(weight: torch.Tensor) -> bool:
    """Whether every value of ``weight`` is a bfloat16 value, so bfloat16 storage loses
    nothing. A float32 is one exactly when its low 16 bits are zero (bfloat16 is the top half);
    checked on the tensor itself, not on a config field that may not describe it."""
    if weight.dtype == torch.bfloat16:
        return True
    if weight.dtype != torch.float32:
        return False
    return not bool(torch.any(weight.detach().contiguous().view(torch.int32) & 0xFFFF))


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
