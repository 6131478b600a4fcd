"""The model runner: vLLM's V1 ``GPUModelRunner`` with device work routed to the device layer
and our rejection sampler in place of vLLM's.

The EAGLE-family and draft-model drafters and the rejection sampler are replaced here, after
the parent constructor built vLLM's (spec_decode/runner_drafters.py); the n-gram and suffix
proposers are built by the parent constructor itself (patch P7 says why).
"""
from __future__ import annotations

import time

import torch
from vllm.config import VllmConfig
from vllm.platforms import current_platform
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from specdec_plugin.adaptive.graphs import AdaptiveGraphsMixin
from specdec_plugin import step_log
from specdec_plugin.log import init_logger

from specdec_plugin.spec_decode.ngram_device import NgramTrimReportMixin
from specdec_plugin.spec_decode.rejection_sampler import SpecDecRejectionSampler
from specdec_plugin.spec_decode.suffix_async_runner import SuffixAsyncMixin
from specdec_plugin.spec_decode.runner_drafters import install_drafter
from specdec_plugin.worker.compiled_helpers import compile_logprob_ranks
from specdec_plugin.worker.kernel_warmup import (
    compile_attention_variants,
    compile_linear_variants,
    compile_spec_decode_kernels,
)
from specdec_plugin.worker.memory_accounting import reserve_attention_workspaces
from specdec_plugin.worker.plain_step_bookkeeping import PlainStepBookkeepingMixin
from specdec_plugin.worker.uniform_step_inputs import UniformStepInputsMixin

logger = init_logger(__name__)


def _compile_at_start(what: str, compile_fn, otherwise: str) -> None:
    """Run one start-up compile step and log what it compiled (``compile_fn`` returns the
    names). A warm-up only saves time: a failure is logged, never fatal."""
    start = time.perf_counter()
    try:
        with torch.inference_mode():
            names = compile_fn()
    except Exception as error:  # noqa: BLE001
        logger.warning("specdec_plugin: start-up warm-up (%s) failed (%s: %s); %s", what,
                       type(error).__name__, error, otherwise)
        return
    if names:
        logger.info("specdec_plugin: %s at start-up: %s (%.1f s)", what, ", ".join(names),
                    time.perf_counter() - start)


# SuffixAsyncMixin before NgramTrimReportMixin: its trims ride on the output the latter tags.
# PlainStepBookkeepingMixin first: it reads the scheduler's output before any mixin trims it.
# UniformStepInputsMixin last, next to vLLM's methods it stands in for: SuffixAsyncMixin's
# wrapper of _calc_spec_decode_metadata keeps the metadata whichever of the two built it.
class SpecDecModelRunner(PlainStepBookkeepingMixin, AdaptiveGraphsMixin, SuffixAsyncMixin,
                         NgramTrimReportMixin, UniformStepInputsMixin, GPUModelRunner):
    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        spec = vllm_config.speculative_config
        if spec is not None and spec.use_ngram_gpu() and not current_platform.device.pin_memory:
            from specdec_plugin.patches import host_pinning

            host_pinning.apply()  # P10: the device n-gram path forced onto the CPU (tests)
        super().__init__(vllm_config, device)
        self.device_layer = current_platform.device
        install_drafter(self)  # EAGLE family and draft model; n-gram and suffix: patch P7
        if hasattr(self, "rejection_sampler"):
            self.rejection_sampler = SpecDecRejectionSampler(
                self.sampler, self.speculative_config, self.device,
                providers=self.device_layer.kernel_providers,
            )

    def profile_run(self) -> None:
        # Our attention workspace would otherwise be allocated with the KV cache, after vLLM
        # sized it: reserved now, the profile's peak counts it (worker/memory_accounting.py).
        reserve_attention_workspaces(self)
        super().profile_run()

    def capture_model(self) -> int:
        graph_bytes = super().capture_model()
        # Then the drafter's graphs, so that no serving step stalls to record one
        # (spec_decode/drafter_padding.py). Ours live in their own pool, charged to the
        # reservation made before the KV cache was sized, not to vLLM's graph estimate.
        prerecord = getattr(getattr(self, "drafter", None), "prerecord_graphs", None)
        if prerecord is not None:
            with torch.inference_mode():
                prerecord()
        if self.device_layer.compiles_kernels_at_first_use:
            # And the attention variants that only eager steps reach (worker/kernel_warmup.py).
            start = time.perf_counter()
            with torch.inference_mode():
                launches = compile_attention_variants(self)
            logger.info("specdec_plugin: %d attention kernel variants launched at start-up "
                        "(%.1f s)", launches, time.perf_counter() - start)
            # And the speculative step's own kernels that vLLM's warm-up leaves to the first
            # request, and vLLM's torch.compile'd sampling helpers (worker/compiled_helpers.py).
            _compile_at_start("speculative kernels launched",
                              lambda: compile_spec_decode_kernels(self),
                              "they compile at the first request instead")
            _compile_at_start("linear kernels launched", lambda: compile_linear_variants(self),
                              "a linear shape compiles at its first product instead")
            _compile_at_start("vLLM's torch.compile'd helpers compiled",
                              lambda: compile_logprob_ranks(self.device,
                                                            self.model_config.get_vocab_size()),
                              "the first logprobs request compiles them")
        return graph_bytes

    # SPECDEC_STEP_LOG (step_log.py): each call's host time.
    def execute_model(self, scheduler_output, *args, **kwargs):
        if not step_log.enabled():
            return super().execute_model(scheduler_output, *args, **kwargs)
        start = time.perf_counter()
        try:
            return super().execute_model(scheduler_output, *args, **kwargs)
        finally:
            step_log.record("exec", ms=round((time.perf_counter() - start) * 1e3, 3),
                            tokens=scheduler_output.total_num_scheduled_tokens)

    def sample_tokens(self, *args, **kwargs):
        if not step_log.enabled():
            return super().sample_tokens(*args, **kwargs)
        start = time.perf_counter()
        try:
            return super().sample_tokens(*args, **kwargs)
        finally:
            step_log.record("sample", ms=round((time.perf_counter() - start) * 1e3, 3))

    # Deferred drafter KV sync (spec_decode/deferred_sync.py): the drafter keeps skipped
    # passes per request, and must hear when those requests' KV blocks are freed.
    def _update_states(self, scheduler_output, *args, **kwargs):
        forget = getattr(getattr(self, "drafter", None), "forget_deferred", None)
        if forget is not None:
            forget(set(scheduler_output.finished_req_ids)
                   | set(scheduler_output.preempted_req_ids or ())
                   | set(scheduler_output.scheduled_cached_reqs.resumed_req_ids))
        return super()._update_states(scheduler_output, *args, **kwargs)

    def _input_fits_in_drafter(self, common_attn_metadata) -> bool:
        fits = super()._input_fits_in_drafter(common_attn_metadata)
        drop = getattr(getattr(self, "drafter", None), "drop_all_deferred", None)
        if not fits and drop is not None:
            drop()  # no drafter pass this step: kept tokens would skip these positions
        return fits

    def _sync_device(self) -> None:
        self.device_layer.synchronize()

    def _dummy_sampler_run(self, hidden_states: torch.Tensor, *args, **kwargs):
        # The warm-up's only purpose on devices without pre-allocated memory is exercising the
        # sampling code once; a few rows do that (256 rows x 49k-vocab sorts took minutes on CPU).
        rows = self.device_layer.sampler_warmup_max_rows
        if rows is not None:
            hidden_states = hidden_states[:rows]
        return super()._dummy_sampler_run(hidden_states, *args, **kwargs)
