"""What every device layer provides: the facts vLLM's Platform needs, and the few runtime hooks
the worker and model runner call where devices really differ."""
from __future__ import annotations

from typing import ClassVar

import torch


class DeviceLayer:
    name: ClassVar[str]
    # torch device type; also vLLM's device_name/device_type for this platform.
    torch_device_type: ClassVar[str]
    # dispatch key for vLLM's custom ops (torch.ops.vllm.*): must match where tensors live.
    dispatch_key: ClassVar[str]
    dist_backend: ClassVar[str]
    # vLLM's class for collectives between this device's ranks (tensor / pipeline parallel);
    # built by vLLM only when a group has more than one rank. The base class goes through
    # torch.distributed on ``dist_backend``.
    communicator_cls: ClassVar[str] = (
        "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase")
    device_control_env_var: ClassVar[str] = "SPECDEC_VISIBLE_DEVICES"
    ray_device_key: ClassVar[str] = ""
    # Kernel providers in order of preference (see specdec_plugin.ops.registry).
    kernel_providers: ClassVar[tuple[str, ...]] = ("torch",)
    # First entry is vLLM's fallback for dtype="auto" on unsupported checkpoint dtypes.
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32,)
    # vLLM extension modules the platform imports in import_kernels (no compute kernels).
    vllm_extensions: ClassVar[tuple[str, ...]] = ()
    supports_graphs: ClassVar[bool] = False
    # Its kernels compile on first launch (Triton): the runner launches each variant serving
    # needs during engine start (worker/kernel_warmup.py) so no live step stalls on a compile.
    compiles_kernels_at_first_use: ClassVar[bool] = False
    # Method "ngram" matches on the device (ops/ngram_match over the runner's device-resident
    # token histories, vLLM's "ngram_gpu" path, which async scheduling overlaps with the step)
    # rather than in the C++ index on the host (spec_decode/ngram_device.py).
    ngram_on_device: ClassVar[bool] = False
    # Async scheduling for the draft model where the user leaves it unset (vLLM 0.26 turns it
    # off for that method unless asked, spec_decode/async_default.py): only where measured.
    async_draft_model: ClassVar[bool] = False
    # SPECDEC_SUFFIX_ASYNC where the user leaves it unset (envs.suffix_async): method "suffix"
    # under async scheduling, drafts made lazily (spec_decode/suffix_lazy.py). "0": vLLM's
    # synchronous scheduling; only where measured.
    suffix_async_default: ClassVar[str] = "0"
    # torch.compile backend for vLLM's model graphs and its small @torch.compile helpers
    # (Platform.simple_compile_backend). "eager" traces without code generation: right where
    # Inductor has no code generator or measured no gain.
    compile_backend: ClassVar[str] = "eager"
    pin_memory: ClassVar[bool] = False
    # vLLM's warm-up samples once at the largest batch to pre-allocate device memory; where
    # memory is not pre-allocated that only costs time (a full-vocabulary sort per row on CPU),
    # so it may be capped. None: vLLM's size.
    sampler_warmup_max_rows: ClassVar[int | None] = None
    # Seconds the engine start may spend timing forward passes for the adaptive draft-length
    # controller's cost table (adaptive/measure.py); past it the table is extrapolated.
    step_cost_budget_s: ClassVar[float] = 4.0
    # Environment defaults for the engine and worker processes vLLM starts (set in the user's
    # process before they start; a value the user set wins).
    process_env: ClassVar[dict[str, str]] = {}
    # The PyTorch package a user installs to get this device, for error messages.
    install_hint: ClassVar[str] = ""

    # ---- detection (cheap, no side effects: vLLM calls the plugin twice per process) ----
    @classmethod
    def is_present(cls) -> bool:
        raise NotImplementedError

    # ---- platform facts ----
    def device_count(self) -> int:
        return 1

    def device_name(self, device_id: int = 0) -> str:
        raise NotImplementedError

    def total_memory(self, device_id: int = 0) -> int:
        raise NotImplementedError

    def memory_usage(self, device: torch.types.Device | None = None) -> float:
        raise NotImplementedError

    def compute_units(self, device_id: int = 0) -> int:
        raise NotImplementedError

    def set_device(self, device: torch.device) -> None:
        pass

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def synchronize(self) -> None:
        pass

    def set_sync_debug_mode(self, mode: str) -> bool:
        """Warn (``"warn"``) or raise (``"error"``) at every call that makes the host wait for
        the device (worker/sync_debug.py). False where the device has no such mode."""
        return False

    def event(self):
        """A device event to record behind queued work and wait on later (``torch.Event``;
        in a CPU worker process patch P5's host stand-in)."""
        return torch.Event(device=torch.device(self.torch_device_type))

    # ---- worker hooks ----
    def worker_device(self, local_rank: int) -> torch.device:
        raise NotImplementedError

    def prepare_worker_process(self, workers_on_host: int = 1) -> None:
        """Process-wide setup in a worker before the model runner exists (threads, patches).

        ``workers_on_host``: how many workers of this engine share this host (tensor x pipeline
        x local data-parallel ranks), for devices whose workers share its cores."""

    def measures_memory(self) -> bool:
        """True if vLLM's own memory profiler works here (it needs torch.accelerator stats)."""
        return False

    # ---- graphs we capture ourselves (the drafter's steps; only where supports_graphs) ----
    def new_graph_pool(self):
        """A memory pool handle shared by graphs that are replayed one after another."""
        raise NotImplementedError(f"{self.name} has no graphs")

    def new_stream(self):
        raise NotImplementedError(f"{self.name} has no graphs")

    def capture_graph(self, fn, pool, stream):
        """Record ``fn()`` into a new graph on ``stream`` without running it.

        Returns ``(graph, fn's result)``; ``graph.replay()`` runs it on the current stream.
        Only calls made by this thread are recorded or checked, so other threads of the
        engine (output copies) may keep using the device meanwhile.
        """
        raise NotImplementedError(f"{self.name} has no graphs")

    def run_on_stream(self, fn, stream):
        """Run ``fn()`` on ``stream`` ordered after the current stream's work, and make the
        current stream wait for it."""
        raise NotImplementedError(f"{self.name} has no graphs")
