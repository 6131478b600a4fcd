"""Model-runner mixin: suffix decoding under async scheduling (``SPECDEC_SUFFIX_ASYNC``).

vLLM 0.26's V1 runner has an async speculative path for drafters whose drafts stay on the
device (EAGLE, ``ngram_gpu``). A host proposer fits it once the runner does, for its steps,
what that path does, and this mixin does only that, through runner methods:

- ``sample_tokens(t)``: no proposal. The step is queued for the lazy proposer
  (spec_decode/suffix_lazy.py) with the host copy of its sampled tokens that vLLM's async
  output starts anyway. ``propose_draft_token_ids`` returns no drafts (an empty tensor).
- ``_bookkeeping_sync(t)``, when step t verified drafts (reserved slots): each request's
  accepted count and last token on the device, handed to vLLM's
  ``_copy_valid_sampled_token_count`` as EAGLE's path does before bookkeeping (without it
  vLLM's async bookkeeping asserts one token per request, and its next-step correction of
  ``num_computed_tokens`` has no counts).
- ``execute_model(t+1)``, when the scheduler reserved draft slots for it: the drafts are made
  now (waiting for step t's copy: the one point where the host needs the device, like
  ``ngram_gpu``'s trim, gpu_model_runner.py:1316-1328), slots beyond a request's draft are
  trimmed as ``ngram_gpu``'s are (``update_scheduler_for_invalid_drafts``), the drafts are
  written into the runner's copy of the scheduler output (host input ids) and uploaded
  in step t's row order as ``_draft_token_ids``, which ``_prepare_input_ids`` scatters
  (gpu_model_runner.py:1866-1889). With no reserved slots (k = 0) nothing waits.
- ``_update_states(t+1)``: each trimmed request's ``prev_num_draft_len`` back to the slots the
  scheduler reserved, as vLLM does after its ``ngram_gpu`` trim (gpu_model_runner.py:1480-1484):
  the scheduler advanced ``num_computed_tokens`` by all of them and the runner's correction
  must undo the same count. The trims reach the scheduler's counters as ``ngram_gpu``'s do
  (``NgramTrimReportMixin``'s ``specdec_trimmed_drafts``).

Uniform draft lengths (``SPECDEC_UNIFORM_DRAFTS``, on by default on CUDA; with adaptive
drafting): a request whose draft is shorter than its reserved slots gets filler (its newest
token, repeated) instead of a trim, as the device n-gram path does (ngram_device.py). Every
request then verifies the same count, the step is a uniform decode batch and replays a full
graph (adaptive/uniform_drafts.py says why that matters). The filler slots reach the scheduler
as ``specdec_filler_drafts``, which it counts as invalid drafts.

Late drafts (``SPECDEC_SUFFIX_LATE_DRAFTS=1``, the CUDA default since session 58, with uniform
draft lengths): the wait above sits at the start of ``execute_model(t+1)``, so the device
idles through all of that step's input preparation (``_update_states``, ``_prepare_inputs``,
attention metadata) as well as the wait and the drafting: a suffix step at synthetic
acceptance 3.0 cost about 7.0 ms on an H200 where the device n-gram path's cost 4.9 and a
plain step 4.5 (BENCHMARKS.md, session 55). With uniform lengths the batch layout does not
depend on the drafts (every reserved slot is verified), so the step is prepared with
placeholders (vLLM's own async path treats the host copies of draft tokens as placeholders
too, gpu_input_batch.py ``update_req_spec_token_ids``) and ``_model_forward`` waits, drafts,
and writes the drafts into the prepared input ids and into the rejection sampler's
``draft_token_ids``, both on the device in stream order before the forward pass. What is
left on the path between the two steps is the wait, the suffix work and one small upload. On
the H200 (session 58, same benchmark) that took a suffix token from 2.45 to 1.77 ms at batch 1
and from 3.08 to 2.22 at batch 16.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from specdec_plugin import envs
from specdec_plugin.adaptive.uniform_drafts import padded_draft
from specdec_plugin.log import init_logger
from specdec_plugin.spec_decode.ngram_device import runner_pads_drafts
from specdec_plugin.spec_decode.suffix_lazy import LazySuffixDrafts

logger = init_logger(__name__)
_UNSET = object()


def accepted_counts(sampled: torch.Tensor, discard: torch.Tensor, vocab_size: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of a rejection-sampler output: the last accepted token and how many were
    accepted (0 for rows whose sample is discarded: a prompt chunk still prefilling), on the
    device, without a host sync. Accepted tokens come first in each row, then -1."""
    rows = sampled.shape[0]
    valid = (sampled != -1) & (sampled < vocab_size) & ~discard[:rows].bool().unsqueeze(1)
    counts = valid.sum(dim=1, dtype=torch.int32)
    last = sampled.gather(1, (counts.long() - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    return torch.where(counts > 0, last, torch.zeros_like(last)), counts


def late_draft_slots(req_ids: list[str], query_end: np.ndarray,
                     drafts: dict[str, list[int]]) -> tuple[list[int], list[int]]:
    """Where each draft goes in a prepared step: (positions in the flat input ids, tokens), in
    batch order, the order of the rejection sampler's ``draft_token_ids``. ``query_end[i]``:
    where row i's tokens end (``query_start_loc[i + 1]``); a row's drafts are its last
    ``len(draft)`` tokens (the sampled token comes first, gpu_model_runner.py
    ``_prepare_input_ids``)."""
    positions: list[int] = []
    tokens: list[int] = []
    for row, req_id in enumerate(req_ids):
        draft = drafts.get(req_id)
        if draft:
            end = int(query_end[row])
            positions.extend(range(end - len(draft), end))
            tokens.extend(draft)
    return positions, tokens


class SuffixAsyncMixin:
    _suffix_state = _UNSET
    _suffix_pads: bool = False
    _suffix_reserved: dict[str, int] | None = None  # this step's reserved slots per request
    _suffix_step: list | None = None  # [k asked for the next step, proposer called]
    _suffix_late_on: bool = False  # SPECDEC_SUFFIX_LATE_DRAFTS with uniform drafts
    _suffix_late: dict[str, int] | None = None  # reserved slots whose drafts come at forward
    _suffix_late_meta = None  # that step's SpecDecodeMetadata (its draft_token_ids)
    _suffix_late_host: torch.Tensor | None = None  # [2, n] positions and tokens, pinned
    _suffix_placeholders: torch.Tensor | None = None  # device zeros, read in place of drafts

    def _lazy_suffix(self) -> LazySuffixDrafts | None:
        if self._suffix_state is _UNSET:
            spec = self.speculative_config
            active = (spec is not None and spec.method == "suffix"
                      and self.use_async_scheduling)
            self._suffix_state = (LazySuffixDrafts(self.drafter, self.input_batch.vocab_size)
                                  if active else None)
            self._suffix_pads = active and runner_pads_drafts(self.vllm_config)
            self._suffix_late_on = self._suffix_pads and envs.suffix_late_drafts()
        return self._suffix_state

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        lazy = self._lazy_suffix()
        if lazy is None:
            return super().execute_model(scheduler_output, intermediate_tensors)
        reserved = {req_id: len(slots)
                    for req_id, slots in scheduler_output.scheduled_spec_decode_tokens.items()
                    if slots}
        self._suffix_reserved = reserved or None
        self._specdec_trimmed = self._specdec_filler = None
        self._suffix_late = self._suffix_late_meta = None
        if not reserved:
            lazy.drain(wait=False)  # index the steps whose copies have landed; never wait
            return super().execute_model(scheduler_output, intermediate_tensors)
        if self._suffix_late_on and self._placeholder_drafts(reserved):
            self._suffix_late = reserved  # drafted in _model_forward, after the preparation
            return super().execute_model(scheduler_output, intermediate_tensors)
        drafts = lazy.drafts(reserved)
        if self._suffix_pads:
            drafts = self._padded_drafts(lazy, reserved, drafts)
        scheduler_output = self._scheduled_with_drafts(scheduler_output, reserved, drafts)
        self._upload_drafts(drafts)
        return super().execute_model(scheduler_output, intermediate_tensors)

    def _padded_drafts(self, lazy: LazySuffixDrafts, reserved: dict[str, int],
                       drafts: dict[str, list[int]]) -> dict[str, list[int]]:
        """Each draft filled up to its reserved slots with the request's newest token; the
        filler counts go to the scheduler with this step's output (``specdec_filler_drafts``)."""
        padded = {req_id: padded_draft(drafts[req_id], slots, lazy.last_token(req_id))
                  for req_id, slots in reserved.items()}
        filler = {req_id: slots - len(drafts[req_id]) for req_id, slots in reserved.items()
                  if len(drafts[req_id]) < slots}
        self._specdec_filler = filler or None
        return padded

    def _scheduled_with_drafts(self, scheduler_output, reserved, drafts):
        """The runner's own copy of the scheduler output (the engine's object is the
        scheduler's, in-process) with each request's draft in its reserved slots, trimmed to
        the draft's length."""
        spec = dict(scheduler_output.scheduled_spec_decode_tokens)
        counts = dict(scheduler_output.num_scheduled_tokens)
        total = scheduler_output.total_num_scheduled_tokens
        trimmed = {}
        for req_id, slots in reserved.items():
            draft = drafts[req_id]
            if len(draft) < slots:
                trimmed[req_id] = slots - len(draft)
                counts[req_id] -= trimmed[req_id]
                total -= trimmed[req_id]
            if draft:
                spec[req_id] = list(draft)
            else:
                spec.pop(req_id, None)
        self._specdec_trimmed = trimmed or None  # reported by NgramTrimReportMixin
        return replace(scheduler_output, scheduled_spec_decode_tokens=spec,
                       num_scheduled_tokens=counts, total_num_scheduled_tokens=total)

    def _upload_drafts(self, drafts: dict[str, list[int]]) -> None:
        """The drafts as ``_draft_token_ids`` ([previous step's rows, width], -1 where none),
        the tensor ``_prepare_input_ids`` scatters; also left in ``draft_token_ids_cpu``, where
        vLLM reads them for penalties (``_get_draft_token_ids_cpu``). Reusing that pinned buffer
        is safe: its last upload fed a step whose sampled tokens ``drafts`` has waited for."""
        written = self._write_host_drafts(drafts)
        if written is None:
            return
        rows, width = written
        self._draft_token_ids = self.draft_token_ids_cpu[:rows, :width].to(
            self.device, non_blocking=True, copy=True)
        self.prev_num_spec_tokens = width
        if self.draft_token_ids_event is not None:
            self.draft_token_ids_event.record()

    def _write_host_drafts(self, drafts: dict[str, list[int]]) -> tuple[int, int] | None:
        """``drafts`` into ``draft_token_ids_cpu`` by the previous step's rows, -1 elsewhere;
        returns (rows, width) to upload, or None when there is nothing to scatter."""
        width = max(map(len, drafts.values()), default=0)
        prev = self.input_batch.prev_req_id_to_index or {}
        rows = self._previous_rows()
        if not width or not rows:
            return None
        view = self.draft_token_ids_cpu.numpy()  # the same pinned memory; no tensor per row
        view[:, :width] = -1  # every row: vLLM may read rows past the last request (prefills)
        for req_id, draft in drafts.items():
            row = prev.get(req_id)
            if draft and row is not None:
                view[row, :len(draft)] = draft
        return rows, width

    def _previous_rows(self) -> int:
        """Rows of the previous step's batch that vLLM scatters drafts from (0: none)."""
        prev = self.input_batch.prev_req_id_to_index
        return max(prev.values()) + 1 if prev else 0

    # ---- late drafts (SPECDEC_SUFFIX_LATE_DRAFTS) ----
    def _placeholder_drafts(self, reserved: dict[str, int]) -> bool:
        """What vLLM's preparation scatters in place of the drafts (zeros, overwritten in
        ``_model_forward``), shaped as ``_upload_drafts`` would shape the real ones. False:
        no previous rows to scatter from, so the step drafts early as before."""
        prev = self.input_batch.prev_req_id_to_index or {}
        if not prev or any(req_id not in prev for req_id in reserved):
            return False
        rows, width = self._previous_rows(), max(reserved.values())
        zeros = self._suffix_placeholders
        if zeros is None or zeros.shape[0] < rows or zeros.shape[1] < width:
            # Once, at the host buffer's full shape: nothing writes into it, so every late
            # step reads a slice of the same zeros.
            shape = (max(rows, self.draft_token_ids_cpu.shape[0]),
                     max(width, self.draft_token_ids_cpu.shape[1]))
            zeros = torch.zeros(shape, dtype=torch.int32, device=self.device)
            self._suffix_placeholders = zeros
        self._draft_token_ids = zeros[:rows, :width]
        self.prev_num_spec_tokens = width
        return True

    def _calc_spec_decode_metadata(self, *args, **kwargs):
        meta = super()._calc_spec_decode_metadata(*args, **kwargs)
        if self._suffix_late is not None:
            self._suffix_late_meta = meta  # its draft_token_ids are gathered from placeholders
        return meta

    def _model_forward(self, *args, **kwargs):
        reserved, self._suffix_late = self._suffix_late, None
        if reserved is not None:
            self._write_late_drafts(reserved)
        return super()._model_forward(*args, **kwargs)

    def _write_late_drafts(self, reserved: dict[str, int]) -> None:
        """Wait for the previous step's tokens, draft, and put the drafts where the prepared
        step reads them: the input ids and the rejection sampler's ``draft_token_ids`` (device,
        stream order: before the forward pass and the sampler), and the host copy vLLM reads
        for penalties (``draft_token_ids_cpu``)."""
        lazy = self._suffix_state
        drafts = self._padded_drafts(lazy, reserved, lazy.drafts(reserved))
        meta, self._suffix_late_meta = self._suffix_late_meta, None
        positions, tokens = late_draft_slots(
            self.input_batch.req_ids, self.query_start_loc.np[1:self.input_batch.num_reqs + 1],
            drafts)
        fits = meta is not None and meta.draft_token_ids.numel() == len(tokens)
        if not fits:
            drafts = self._late_drafts_misfit(reserved, meta, len(tokens))
        self._write_host_drafts(drafts)
        if self.draft_token_ids_event is not None:
            self.draft_token_ids_event.record()
        if not fits or not tokens:
            return
        host = self._late_host_buffer(len(tokens))
        view = host.numpy()  # the same pinned memory
        view[0, :len(tokens)] = positions
        view[1, :len(tokens)] = tokens
        # Safe to reuse the buffer: its previous upload fed a step whose output drafts() has
        # waited for.
        slots = host[:, :len(tokens)].to(self.device, non_blocking=True, copy=True)
        ids = slots[1].to(self.input_ids.gpu.dtype)
        self.input_ids.gpu.index_copy_(0, slots[0], ids)
        meta.draft_token_ids.copy_(ids)

    def _late_drafts_misfit(self, reserved: dict[str, int], meta,
                            num_tokens: int) -> dict[str, list[int]]:
        """The drafts do not fit the prepared step: a layout this path did not foresee (a bug).
        Not a reason to fail every request in the engine: this step verifies its placeholder
        drafts, which costs nothing in correctness (verification keeps only what the target
        itself picks: greedy, its argmax; sampled, rejection sampling is exact for any draft),
        no slot is counted as a draft, and later steps draft before their preparation
        (SPECDEC_SUFFIX_LATE_DRAFTS=0's path). Returns the placeholders as drafts, for the
        host copy that penalties read."""
        slots = None if meta is None else meta.draft_token_ids.numel()
        logger.error("specdec_plugin: late suffix drafts (%d tokens) do not fit the prepared "
                     "step (%s draft slots); this step verifies placeholders and later steps "
                     "draft before their preparation. Please report this; "
                     "SPECDEC_SUFFIX_LATE_DRAFTS=0 avoids the path.", num_tokens, slots)
        self._suffix_late_on = False
        self._specdec_filler = dict(reserved)
        return {req_id: [0] * n for req_id, n in reserved.items()}

    def _late_host_buffer(self, n: int) -> torch.Tensor:
        buffer = self._suffix_late_host
        if buffer is None or buffer.shape[1] < n:
            size = max(n, self.input_ids.gpu.shape[0])
            buffer = torch.empty((2, size), dtype=torch.int64,
                                 pin_memory=self.device_layer.pin_memory)
            self._suffix_late_host = buffer
        return buffer

    def _update_states(self, scheduler_output, *args, **kwargs):
        result = super()._update_states(scheduler_output, *args, **kwargs)
        if self._lazy_suffix() is not None and self._suffix_reserved:
            for req_id, slots in self._suffix_reserved.items():
                state = self.requests.get(req_id)
                if state is not None:
                    state.prev_num_draft_len = slots
        return result

    def _bookkeeping_sync(self, scheduler_output, sampler_output, *args, **kwargs):
        if self._lazy_suffix() is not None:
            self._suffix_step = [scheduler_output.num_spec_tokens_to_schedule, False]
            if self._suffix_reserved:
                self._copy_valid_sampled_token_count(*accepted_counts(
                    sampler_output.sampled_token_ids, self.discard_request_mask.gpu,
                    self.input_batch.vocab_size))
        return super()._bookkeeping_sync(scheduler_output, sampler_output, *args, **kwargs)

    def propose_draft_token_ids(self, *args, **kwargs):
        if self._lazy_suffix() is None:
            return super().propose_draft_token_ids(*args, **kwargs)
        if self._suffix_step is not None:
            self._suffix_step[1] = True  # the batch fits: the next step may draft
        # No drafts yet: an empty tensor rather than None, because vLLM reads this one back as
        # a tensor when it copies drafts to the host for structured output or penalties
        # (_copy_draft_token_ids_to_cpu, _get_draft_token_ids_cpu); a drafting step replaces it.
        return torch.empty((self.input_batch.num_reqs, 0), dtype=torch.int32,
                           device=self.device)

    def sample_tokens(self, grammar_output):
        lazy = self._lazy_suffix()
        if lazy is None:
            return super().sample_tokens(grammar_output)
        self._suffix_step = None
        output = super().sample_tokens(grammar_output)
        step, self._suffix_step = self._suffix_step, None
        inner = getattr(output, "_model_runner_output", None)
        if step is not None and inner is not None:
            k, fits = step
            lazy.record(inner.req_ids, output.sampled_token_ids_cpu,
                        output.async_copy_ready_event, set(output._invalid_req_indices),
                        k if fits else 0, self._history_before_step)
        return output

    def _history_before_step(self, row: int, req_id: str) -> tuple[list[int], list[int]]:
        """A request's prompt and output before the step just sampled (the request's state
        ends with that step's placeholder, -1, and real tokens before it: the request is new,
        or came back into the batch with its output restored, gpu_model_runner.py:1436-1440)."""
        state = self.requests[req_id]
        prompt = state.prompt_token_ids
        if prompt is None:
            prompt = self.input_batch.token_ids_cpu[row, :self.input_batch.num_prompt_tokens[row]]
        output = [t for t in state.output_token_ids if t >= 0]
        return list(prompt), output
