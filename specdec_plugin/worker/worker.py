"""The worker: vLLM's V1 GPU worker, with device setup and memory accounting taken from the
device layer so that the same class runs on CPU, NVIDIA GPUs and (designed for) Ascend NPUs."""
from __future__ import annotations

import gc
from contextlib import AbstractContextManager, nullcontext

import torch
from specdec_plugin.log import init_logger
from vllm.distributed.parallel_state import get_pp_group
from vllm.platforms import current_platform
from vllm.utils.mem_utils import MemorySnapshot, format_gib
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.utils import request_memory
from vllm.v1.worker.workspace import init_workspace_manager

from specdec_plugin import envs
from specdec_plugin.patches import apply_worker_patches
from specdec_plugin.worker import compile_log, sync_debug
from specdec_plugin.worker.device_index import dp_adjusted_local_rank, visible_device_index
from specdec_plugin.worker.memory_accounting import (
    counted_by_startup_plan,
    kv_cache_bytes_after,
    memory_outside_profile,
)
from specdec_plugin.worker.model_runner import SpecDecModelRunner

logger = init_logger(__name__)

# Tokens in the start-up forward pass on devices whose memory is not profiled.
PROFILE_TOKENS = 64


class SpecDecWorker(Worker):
    @property
    def device_layer(self):
        return current_platform.device

    def init_device(self) -> None:
        layer = self.device_layer
        parallel = self.parallel_config
        layer.prepare_worker_process(parallel.world_size * parallel.data_parallel_size_local)
        apply_worker_patches(layer.kernel_providers)
        compile_log.install()  # SPECDEC_LOG_TRITON_COMPILES=1 only
        # Our norm / rotary / activation layers, before any model or drafter is built.
        from specdec_plugin.ops.custom_ops import register_custom_ops

        register_custom_ops(self.device_layer.kernel_providers)

        if layer.torch_device_type == "cpu":
            self.device = layer.worker_device(self.local_rank)
        else:  # vLLM's selection: data-parallel offset, logical -> visible ordinal
            self.local_rank = dp_adjusted_local_rank(self.local_rank, self.parallel_config)
            self.device = layer.worker_device(visible_device_index(
                self.local_rank, self.parallel_config, current_platform, layer.device_count()))
        layer.set_device(self.device)
        current_platform.check_if_supports_dtype(self.model_config.dtype)
        init_worker_distributed_environment(
            self.vllm_config, self.rank, self.distributed_init_method, self.local_rank,
            current_platform.dist_backend,
        )
        set_random_seed(self.model_config.seed)

        if layer.measures_memory():
            # vLLM's profiler compares against this snapshot to size the KV cache.
            gc.collect()
            torch.accelerator.empty_cache()
            self.init_snapshot = MemorySnapshot(device=self.device)
            self.requested_memory = request_memory(self.init_snapshot, self.cache_config)
            # What vLLM's budget is measured from: the device's use now plus requested_memory
            # is what this worker may reach (tests/gpu/test_serve_gpu.py holds it to that).
            snapshot = self.init_snapshot
            logger.info("specdec_plugin: device memory at start: %d bytes used of %d; budget "
                        "%d bytes (gpu_memory_utilization %s)",
                        snapshot.total_memory - snapshot.free_memory, snapshot.total_memory,
                        self.requested_memory, self.cache_config.gpu_memory_utilization)

        init_workspace_manager(self.device, 2 if self.parallel_config.enable_dbo else 1)
        self.model_runner = SpecDecModelRunner(self.vllm_config, self.device)

    def _maybe_get_memory_pool_context(self, tag: str) -> AbstractContextManager:
        # vLLM's sleep-mode allocator exists only for CUDA/ROCm/XPU and raises for an
        # out-of-tree platform; we have no sleep mode.
        return nullcontext()

    @torch.inference_mode()
    def determine_available_memory(self) -> int:
        if self.device_layer.measures_memory():
            user_sized = bool(self.cache_config.kv_cache_memory_bytes)  # as vLLM reads it
            available = super().determine_available_memory()
            if user_sized:
                return available  # the user's size, as vLLM takes it
            # Set during super() only by vLLM's startup plan (VLLM_ENABLE_STARTUP_PLAN=1).
            planned = bool(self.cache_config.kv_cache_memory_bytes)
            # What vLLM's profile did not see (worker/memory_accounting.py).
            outside = memory_outside_profile(self, counted_by_startup_plan(planned))
            kept = kv_cache_bytes_after(available, outside)
            self.available_kv_cache_memory_bytes = kept
            logger.info("specdec_plugin: KV cache %s GiB after holding back %s (GiB) outside "
                        "vLLM's profile", format_gib(kept),
                        ", ".join(f"{k} {format_gib(v)}" for k, v in outside.items()))
            return kept
        # No device memory to measure, so no full-size profiling pass (on CPU it took most of
        # the engine start): one short forward and sampling pass exercise every kernel once.
        runner = self.model_runner
        _, last_hidden_states = runner._dummy_run(min(runner.max_num_tokens, PROFILE_TOKENS), is_profile=True)
        if get_pp_group().is_last_rank:  # earlier pipeline stages have no logits to sample
            runner._dummy_sampler_run(last_hidden_states)
        budget = self.cache_config.kv_cache_memory_bytes or envs.cpu_kv_cache_bytes()
        logger.info("specdec_plugin: KV cache budget on %s: %s GiB", self.device_layer.name, format_gib(budget))
        return int(budget)

    def compile_or_warm_up_model(self):
        result = super().compile_or_warm_up_model()
        # Graphs are captured by now: time them for the adaptive draft-length controller.
        from specdec_plugin.adaptive.measure import measure_and_publish

        layer = self.device_layer
        measure_and_publish(self.model_runner, self.vllm_config, self.rank,
                            layer.step_cost_budget_s, layer.synchronize)
        sync_debug.enable_after_startup(layer)  # SPECDEC_SYNC_DEBUG only
        return result
