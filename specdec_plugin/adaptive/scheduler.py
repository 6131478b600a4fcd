"""vLLM's scheduler with the adaptive controller choosing each step's draft length.

vLLM 0.26 already carries a per-step draft length from scheduler to proposer
(``SchedulerOutput.num_spec_tokens_to_schedule``), filled from a batch-size lookup table
(``Scheduler.dynamic_sd_lookup``) when the user gives ``num_speculative_tokens_per_batch_size``.
We put the controller in that table's seat: ``dynamic_sd_lookup[num_reqs]`` asks the
controller. A non-None lookup also turns off vLLM's padding of new decode requests to 1+K
tokens, which would be wrong when the step drafts fewer.

The scheduler also times each step (``step_timing.py``: when it starts building a step, when
the step's result arrives and when it has been handled) and feeds the pure decode steps' times
to the controller, which corrects its cost table with them (``observed_cost.py``), and, where
the controller measures its probes, every step's interval with whether the step was a probe
(``probe_cost.py``).

The class is chosen through vLLM's ``scheduler_cls`` setting (``config.py``), with vLLM's
async scheduler as base where async scheduling is on.
"""
from __future__ import annotations

import time

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from specdec_plugin import step_log
from specdec_plugin.adaptive.config import controller_settings
from specdec_plugin.adaptive.controller import DraftLengthController
from specdec_plugin.adaptive.cost_model import CostTable, fallback_table
from specdec_plugin.adaptive.handoff import read_cost_table
from specdec_plugin.adaptive.step_timing import StepTimer
from specdec_plugin.adaptive.uniform_drafts import UniformDraftsMixin, add_invalid_spec_tokens
from specdec_plugin.log import init_logger
from specdec_plugin.spec_decode.deferred_sync import tail_block_ids, uncache_window
from specdec_plugin.spec_decode.drafter_prefix_cache import keep_drafter_prefix_blocks
from specdec_plugin.spec_decode.ngram_device import TRIMMED_DRAFTS

logger = init_logger(__name__)


class _AskController:
    """Stands in for vLLM's dense batch-size -> K table."""

    def __init__(self, scheduler: "AdaptiveSchedulerMixin"):
        self._scheduler = scheduler

    def __getitem__(self, num_reqs: int) -> int:
        return self._scheduler.choose_draft_length()


def load_cost_table(vllm_config, has_drafter_model: bool) -> CostTable:
    text = read_cost_table(vllm_config)
    if text is not None:
        try:
            return CostTable.from_json(text)
        except (ValueError, TypeError, KeyError) as exc:
            logger.warning("specdec_plugin: unreadable cost table (%s); using a fallback", exc)
    else:
        logger.warning("specdec_plugin: no step costs were measured at start-up; adaptive "
                       "drafting uses a fallback cost model")
    return fallback_table(has_drafter_model)


class AdaptiveSchedulerMixin:
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spec = self.vllm_config.speculative_config
        has_drafter_model = spec.use_eagle() or spec.uses_draft_model()
        cost = load_cost_table(self.vllm_config, has_drafter_model)
        settings = controller_settings(spec.method)
        learn_costs = settings["learn_costs"]
        self.draft_controller = DraftLengthController(self.num_spec_tokens, cost, **settings)
        self.dynamic_sd_lookup = _AskController(self)
        self._step_timer = (StepTimer(cost.step_time)
                            if learn_costs or settings["measure_probes"] else None)
        # Scheduler outputs whose drafts are a probe, until their result is handled (by id,
        # as the step timer; bounded as its dict is, should a step fail).
        self._probe_outputs: list[int] = []
        # Deferred drafter KV sync with prefix caching (spec_decode/deferred_sync.py).
        self._uncache_window = uncache_window(self.vllm_config)
        # Prefix-cache hits keep their last block for EAGLE-family drafters (patch P13).
        keep_drafter_prefix_blocks(self.kv_cache_manager, self.vllm_config)
        logger.info("specdec_plugin: adaptive drafting on (K=%d, lengths %s, %s step costs%s); "
                    "SPECDEC_ADAPTIVE=0 turns it off", self.num_spec_tokens,
                    list(self.draft_controller.allowed), cost.source,
                    ", corrected by observed step times" if learn_costs else "")

    def choose_draft_length(self) -> int:
        return self.draft_controller.choose([req.request_id for req in self.running])

    def schedule(self, *args, **kwargs):
        started = time.perf_counter()
        probes = self.draft_controller.probes
        scheduler_output = super().schedule(*args, **kwargs)
        if self._step_timer is not None:
            self._step_timer.scheduled(scheduler_output, started)
        controller = self.draft_controller
        if controller.probe_cost is not None and controller.probes != probes:
            self._probe_outputs = self._probe_outputs[-15:] + [id(scheduler_output)]
        if step_log.enabled():
            step_log.record("sched", build_ms=round((time.perf_counter() - started) * 1e3, 3),
                            n=len(scheduler_output.num_scheduled_tokens),
                            tokens=scheduler_output.total_num_scheduled_tokens,
                            new=len(scheduler_output.scheduled_new_reqs),
                            k=scheduler_output.num_spec_tokens_to_schedule)
        return scheduler_output

    def update_from_output(self, scheduler_output, model_runner_output):
        # First: the moment the step's result is here is the end of its interval.
        step_time = None
        if self._step_timer is not None:
            step_time = self._step_timer.output(scheduler_output, time.perf_counter())
            if self.draft_controller.probe_cost is not None:
                self._observe_interval(scheduler_output)
        if step_log.enabled():
            step_log.record("result", tokens=scheduler_output.total_num_scheduled_tokens)
        # Device n-gram (method ngram_gpu): draft slots the runner trimmed because the match
        # drafted fewer count as vLLM's invalid spec tokens, as if never drafted, which is what
        # the host index reports (spec_decode/ngram_device.py, NgramTrimReportMixin).
        # With uniform drafts the runner verifies those slots with filler instead: the
        # filler accounting is UniformDraftsMixin's (uniform_drafts.py).
        add_invalid_spec_tokens(scheduler_output,
                                getattr(model_runner_output, TRIMMED_DRAFTS, None) or {})
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if self._step_timer is not None:
            self._step_timer.output_done(time.perf_counter())
        if step_time is not None:  # the controller keeps it only where it learns costs
            self.draft_controller.observe_step_time(step_time.num_reqs, step_time.k,
                                                    step_time.seconds)
        return outputs

    def _observe_interval(self, scheduler_output) -> None:
        probe = id(scheduler_output) in self._probe_outputs
        if probe:
            self._probe_outputs.remove(id(scheduler_output))
        interval = self._step_timer.last_interval
        if interval is None:
            # Untimed (the first result, an empty step): an open probe window ends here.
            self.draft_controller.observe_interval(0, 0.0, False, False, probe)
            return
        self.draft_controller.observe_interval(
            interval.num_reqs, interval.seconds, interval.steady,
            interval.verified == 0 and interval.chose == 0, probe)

    def make_spec_decoding_stats(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
                                 num_invalid_spec_tokens, request_id):
        drafted = num_draft_tokens
        if num_invalid_spec_tokens:
            drafted -= num_invalid_spec_tokens.get(request_id, 0)
        # Filler slots (uniform_drafts.py) are not drafts for vLLM's metrics, but each cost a
        # verification slot: the controller learns what a slot is worth. (UniformDraftsMixin,
        # next in the bases, keeps an accepted filler out of vLLM's accepted count.)
        self.draft_controller.observe(request_id, drafted + self.filler_slots(request_id),
                                      num_accepted_tokens)
        if drafted <= 0:
            # Every slot invalid (a device n-gram request with no match): no draft, as the host
            # index reports it; vLLM would count a draft of 0 tokens.
            return spec_decoding_stats
        return super().make_spec_decoding_stats(spec_decoding_stats, num_draft_tokens,
                                                num_accepted_tokens, num_invalid_spec_tokens,
                                                request_id)

    def _free_request_blocks(self, request):
        # A finished or preempted request's last positions may hold drafter KV the worker
        # deferred and will now never write: keep their blocks out of the prefix cache.
        stale = set()
        if self._uncache_window is not None:
            stale = tail_block_ids(self.kv_cache_manager.get_block_ids(request.request_id),
                                   request.num_computed_tokens, self.cache_config.block_size,
                                   self._uncache_window)
        super()._free_request_blocks(request)
        if stale:
            self.kv_cache_manager.block_pool.evict_blocks(stale)

    def _free_request(self, request, *args, **kwargs):
        self.draft_controller.forget(request.request_id)
        return super()._free_request(request, *args, **kwargs)


class AdaptiveScheduler(AdaptiveSchedulerMixin, UniformDraftsMixin, Scheduler):
    pass


class AdaptiveAsyncScheduler(AdaptiveSchedulerMixin, UniformDraftsMixin, AsyncScheduler):
    pass  # drafts stay on the device: no host padding, the runner's filler is accounted
