"""Method "ngram" matched on the device: vLLM's ``ngram_gpu`` path with our ``ngram_match``
kernel (``ops/ngram_match``), so n-gram steps run with async scheduling.

How it fits in vLLM 0.26:
- The user's ``method: "ngram"`` becomes vLLM's ``"ngram_gpu"`` before vLLM builds its config
  (``device_ngram_method``, called from patch P6), on devices whose layer says
  ``ngram_on_device`` (or with ``SPECDEC_NGRAM_ON_DEVICE=1``). vLLM then resolves async
  scheduling itself (it allows it for ``ngram_gpu``), as for a user who asked for that method.
- The V1 runner keeps, for ``ngram_gpu``, a device copy of every request's token history and
  length (``token_ids_gpu_tensor``, ``num_tokens_no_spec_gpu``: gpu_model_runner.py:609-625,
  1499-1509, 1537-1539), trims each request's scheduled drafts to the count the proposer
  returned (``update_scheduler_for_invalid_drafts``) and hands the drafts to the next step on
  the device. All of that stays vLLM's; only the proposer is ours (patch P7 rebinds the
  runner's ``NgramProposerGPU`` name to ``SpecDecNgramProposerGPU``).
- Drafts equal the C++ index's on the same history (tests/ops/test_ngram_match.py), including
  its ``max_model_len`` cap, which vLLM's own ngram_gpu kernel does not apply.

The CPU keeps the host index by default (it measured fastest there); forcing this path on the
CPU runs the torch reference kernel (the engine tests do, to check the wiring without a GPU).
"""
from __future__ import annotations

import torch
from vllm.config import VllmConfig
from vllm.v1.spec_decode.ngram_proposer_gpu import NgramProposerGPU

from specdec_plugin import envs
from specdec_plugin.ops.registry import get_kernel
from specdec_plugin.spec_decode.config_checks import NGRAM_MODEL_NAMES, speculative_method

# The user's method -> the method vLLM runs, by where matching happens (True: the device).
_METHOD_FOR = {
    True: {"ngram": "ngram_gpu", "ngram_gpu": "ngram_gpu"},
    False: {"ngram": "ngram", "ngram_gpu": "ngram"},
}


def ngram_on_device(device_layer) -> bool:
    forced = envs.ngram_on_device()
    return device_layer.ngram_on_device if forced is None else forced


def device_ngram_method(spec: dict, device_layer) -> dict:
    """The user's speculative config with the n-gram method vLLM should run on this device (a
    copy where it changes; the user's dict is never modified). ``model: "ngram"`` without a
    method is vLLM's other spelling of method "ngram"."""
    wanted = _METHOD_FOR[ngram_on_device(device_layer)].get(speculative_method(spec))
    if wanted is None or (wanted == spec.get("method") and "model" not in spec):
        return spec
    out = dict(spec, method=wanted)
    if out.get("model") in (*NGRAM_MODEL_NAMES, "ngram_gpu"):
        out.pop("model")  # vLLM names the model after the method itself
    return out


class SpecDecNgramProposerGPU(NgramProposerGPU):
    """vLLM's device n-gram proposer with our matching kernel.

    ``super().__init__`` is skipped on purpose: it compiles vLLM's own kernel with Inductor and
    runs it three times on a ``max_num_seqs x max_model_len`` dummy batch. The runner reads no
    attribute of ours besides the methods (``propose``, ``update_token_ids_ngram``, which only
    needs ``device``, and ``load_model``).
    """

    def __init__(self, vllm_config: VllmConfig, device: torch.device, runner=None):
        from vllm.platforms import current_platform

        spec = vllm_config.speculative_config
        self.vllm_config = vllm_config
        self.min_n = spec.prompt_lookup_min
        self.max_n = spec.prompt_lookup_max
        self.k = spec.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.max_num_seqs = vllm_config.scheduler_config.max_num_seqs
        self.device = device
        providers = tuple(current_platform.device.kernel_providers)
        self.match = get_kernel("ngram_match", providers)
        self.step_update = get_kernel("ngram_step_update", providers)
        # Uniform draft lengths (adaptive/uniform_drafts.py): unmatched slots carry filler.
        self.pad_to_k = pads_device_drafts(vllm_config)
        self._warm_up()

    def _warm_up(self) -> None:
        """Compile the kernel for every draft length a step may ask (the adaptive controller
        chooses 1..K; Triton specialises on the padded length and on k == 1) with the shapes
        and argument kinds the runner passes (rows max_model_len wide, an active mask), so that
        no compile happens while serving."""
        tokens = torch.ones((1, self.max_model_len), dtype=torch.int32, device=self.device)
        num_tokens = torch.full((1,), min(4, self.max_model_len), dtype=torch.int32,
                                device=self.device)
        active = torch.ones(1, dtype=torch.bool, device=self.device)
        for k in range(1, self.k + 1):
            self.match(tokens, num_tokens, active, self.min_n, self.max_n, k, self.max_model_len)
        # And the step update for every sampled width (1 + the step's draft length).
        for k in range(0, self.k + 1):
            sampled = torch.full((1, 1 + k), -1, dtype=torch.int32, device=self.device)
            self.step_update(sampled, ~active, tokens.clone(), num_tokens, 1)

    def update_token_ids_ngram(self, sampled_token_ids, gpu_input_batch, token_ids_gpu,
                               num_tokens_no_spec, discard_request_mask):
        """vLLM's step bookkeeping, then this step's accepted tokens appended to each history,
        in one kernel (ops/ngram_update: about 25 torch ops before).

        vLLM appends them in ``propose`` instead; but the runner calls only this method on a
        step where the batch's longest request is too close to ``max_model_len`` to draft
        (gpu_model_runner.py:4620-4640), and the histories, which live only on the device,
        would then miss that step's tokens for every request for good.
        """
        if isinstance(sampled_token_ids, list):  # vLLM's unpadded path: rows padded with -1
            width = max([1, *(len(row) for row in sampled_token_ids)])
            sampled_token_ids = torch.tensor(
                [row + [-1] * (width - len(row)) for row in sampled_token_ids],
                dtype=torch.int32, device=self.device)
        return self.step_update(sampled_token_ids, discard_request_mask, token_ids_gpu,
                                num_tokens_no_spec, gpu_input_batch.vocab_size)

    def propose(self, num_speculative_tokens: int, num_tokens_no_spec: torch.Tensor,
                token_ids_gpu: torch.Tensor, valid_sampled_token_ids_gpu: torch.Tensor,
                valid_sampled_tokens_count: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Match on the histories ``update_token_ids_ngram`` just appended to.

        ``num_speculative_tokens`` is the step's draft length (the adaptive controller's choice
        through ``SchedulerOutput.num_spec_tokens_to_schedule``; vLLM's own proposer asserts
        it equals K). Drafts are ``[batch, that length]``: the scheduler reserved that many
        placeholders per request for the next step, and the runner trims each request to its
        count.

        At 0 (a plain step) no matching runs, and the counts are ``None``: the runner then
        records no event for their copy to the host (``copy_num_valid_draft_tokens`` returns
        early), so the next step's trim, which first waits on that event
        (``update_scheduler_for_invalid_drafts``) and has no drafts to trim, does not wait for
        this step's device work: plain steps keep async scheduling's overlap.
        """
        k = max(0, min(num_speculative_tokens, self.k))
        batch = num_tokens_no_spec.shape[0]
        if k == 0:
            return torch.empty((batch, 0), dtype=torch.int32, device=self.device), None
        # A request drafts once it has sampled this step (not while its prompt is prefilling).
        num_tokens = num_tokens_no_spec + valid_sampled_tokens_count
        drafts, counts = self.match(token_ids_gpu, num_tokens, valid_sampled_tokens_count > 0,
                                    self.min_n, self.max_n, k, self.max_model_len)
        if self.pad_to_k:
            drafts = fill_unmatched(drafts, counts, token_ids_gpu, num_tokens)
        return drafts, counts

    def load_model(self, *args, **kwargs) -> None:
        pass


def fill_unmatched(drafts: torch.Tensor, counts: torch.Tensor, token_ids: torch.Tensor,
                   num_tokens: torch.Tensor) -> torch.Tensor:
    """Each row's slots past its match count filled with the row's last history token (a valid
    id to verify, where the kernel leaves -1), on the device, without a host sync."""
    rows = torch.arange(drafts.shape[0], device=drafts.device)
    last = token_ids[rows, (num_tokens.long() - 1).clamp(0, token_ids.shape[1] - 1)]
    cols = torch.arange(drafts.shape[1], device=drafts.device)
    matched = cols.unsqueeze(0) < counts.unsqueeze(1)
    return torch.where(matched, drafts, last.to(drafts.dtype).unsqueeze(1))


def runner_pads_drafts(vllm_config) -> bool:
    """Whether a runner path that makes drafts verifies filler instead of trimming
    (``SPECDEC_UNIFORM_DRAFTS=1`` with adaptive drafting, whose scheduler counts the filler, as
    for the host proposers in adaptive/uniform_drafts.py)."""
    from specdec_plugin.adaptive.config import adaptive_enabled

    return envs.uniform_drafts() and adaptive_enabled(vllm_config)


def pads_device_drafts(vllm_config) -> bool:
    """Uniform draft lengths for the device n-gram path."""
    spec = vllm_config.speculative_config
    return runner_pads_drafts(vllm_config) and spec is not None and spec.use_ngram_gpu()


# The attributes of ModelRunnerOutput that carry, to the scheduler, the draft slots the runner
# trimmed (never verified) and those it verified with filler (uniform drafts).
TRIMMED_DRAFTS = "specdec_trimmed_drafts"
FILLER_DRAFTS = "specdec_filler_drafts"


class _NoWait:
    """Stands in for the runner's event of the draft counts' copy: nothing to wait for."""

    def synchronize(self) -> None:
        pass


class NgramTrimReportMixin:
    """Model-runner mixin: tells the scheduler how many of each request's reserved draft slots
    the runner trimmed because the device n-gram match drafted fewer (or none).

    With ``ngram_gpu`` the scheduler reserves the step's draft length for every request before
    drafts exist, and the runner trims each request to its match
    (``update_scheduler_for_invalid_drafts``, on its own copy of the scheduler output). vLLM's
    scheduler never learns of the trim, so its counters, and the adaptive controller, which
    observes the same verification results, would count unmatched slots as drafted and
    rejected; the host index simply drafts nothing there. The trims ride on the step's
    ``ModelRunnerOutput`` as ``specdec_trimmed_drafts`` ({request id: slots trimmed}); the
    adaptive scheduler (adaptive/scheduler.py) reads them as vLLM's ``num_invalid_spec_tokens``.
    Where the output crosses processes without the attribute, counting falls back to vLLM's.
    """

    _specdec_trimmed: dict[str, int] | None = None
    # Filler slots another runner path verified this step (suffix under async scheduling).
    _specdec_filler: dict[str, int] | None = None
    _specdec_counts: tuple | None = None  # (event, host counts, rows, slots) of the last step
    # Host buffers of the untrimmed path, allocated at its first step: the previous step's
    # match counts, and the counts handed to vLLM's trim (every slot kept).
    _specdec_counts_host: torch.Tensor | None = None
    _specdec_keep_all: torch.Tensor | None = None

    def _update_states(self, scheduler_output):
        spec = self.speculative_config
        if spec is None or not spec.use_ngram_gpu():
            return super()._update_states(scheduler_output)
        if getattr(self.drafter, "pad_to_k", False):
            return self._update_states_untrimmed(scheduler_output)
        # The runner's own copy of the scheduler output (gpu_model_runner.py:4125-4140),
        # trimmed in place by the call below.
        reserved = {req: len(slots)
                    for req, slots in scheduler_output.scheduled_spec_decode_tokens.items()}
        result = super()._update_states(scheduler_output)
        kept = scheduler_output.scheduled_spec_decode_tokens
        self._specdec_trimmed = {req: n - len(kept.get(req, ()))
                                 for req, n in reserved.items() if n > len(kept.get(req, ()))}
        return result

    def _update_states_untrimmed(self, scheduler_output):
        """Uniform drafts: every reserved slot is verified, unmatched ones with filler
        (``fill_unmatched``), so the step stays a uniform decode batch. vLLM's trim first waits
        for the previous step's draft counts (host sync) and then trims: both are skipped by
        handing it counts that keep every slot and an event with nothing to wait for. The real
        counts are copied to the host behind the previous step's work, and read once this
        step's forward is queued (``sample_tokens``), to report the filler slots."""
        slots = {req: len(s) for req, s in scheduler_output.scheduled_spec_decode_tokens.items()}
        counts = self._num_valid_draft_tokens
        self._specdec_counts = None
        if slots and counts is not None:
            host = self._specdec_counts_host
            if host is None or host.shape != counts.shape or host.dtype != counts.dtype:
                host = self._specdec_counts_host = torch.empty(
                    counts.shape, dtype=counts.dtype, device="cpu",
                    pin_memory=self.device_layer.pin_memory)
            # Read in this step's sample_tokens, before the next step copies over it.
            host.copy_(counts, non_blocking=True)
            event = self.device_layer.event()
            event.record()
            # Rows as the previous step's batch numbered them (the batch changes below).
            rows = {req: self.input_batch.req_id_to_index.get(req) for req in slots}
            self._specdec_counts = (event, host, rows, slots)
        saved = self._num_valid_draft_tokens_event, self._num_valid_draft_tokens_cpu
        if self._specdec_keep_all is None:
            self._specdec_keep_all = torch.full_like(self._num_valid_draft_tokens_cpu,
                                                     self.num_spec_tokens + 1)
        keep_all = self._specdec_keep_all
        self._num_valid_draft_tokens_event, self._num_valid_draft_tokens_cpu = _NoWait(), keep_all
        try:
            return super()._update_states(scheduler_output)
        finally:
            self._num_valid_draft_tokens_event, self._num_valid_draft_tokens_cpu = saved

    def _filler_of_last_step(self) -> dict[str, int]:
        pending, self._specdec_counts = self._specdec_counts, None
        if pending is None:
            return {}
        event, host, rows, slots = pending
        event.synchronize()  # the previous step's work only: this step's is queued behind it
        # One conversion, not two tensor reads per request: at batch 64 the per-row reads
        # were about 15,000 host tensor ops per 122 steps on the H100 profile (session 15).
        counts = host.tolist()
        filler = {}
        for req, n in slots.items():
            row = rows.get(req)
            if row is not None and row < len(counts) and counts[row] < n:
                filler[req] = n - max(counts[row], 0)
        return filler

    def sample_tokens(self, grammar_output):
        output = super().sample_tokens(grammar_output)
        trimmed, self._specdec_trimmed = self._specdec_trimmed, None
        filler = self._filler_of_last_step()
        if self._specdec_filler:
            filler = {**filler, **self._specdec_filler}
        self._specdec_filler = None
        if trimmed or filler:
            from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

            # Async scheduling wraps the output that its get_output() later returns.
            inner = getattr(output, "_model_runner_output", output)
            if isinstance(inner, ModelRunnerOutput) and inner is not EMPTY_MODEL_RUNNER_OUTPUT:
                if trimmed:
                    setattr(inner, TRIMMED_DRAFTS, trimmed)
                if filler:
                    setattr(inner, FILLER_DRAFTS, filler)
        return output
