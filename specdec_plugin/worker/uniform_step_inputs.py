"""Model-runner mixin: a uniform speculative step's index tensors without per-step uploads.

Why: a batch-1 EAGLE-3 device profile on an H200 (issue 12, session 61,
``benchmarks/results/profiles_2026-12-02_session61/``) found the device idle before each target
forward while our host was still preparing the step, and our host making 158 CUDA calls a
step where vLLM's own engine (its V2 runner) makes 109. Ten times a step ours allocates a
pinned host tensor and copies it to the device, nine of them in two methods of vLLM 0.26's V1
runner that rebuild, every step, index tensors that depend only on the batch's shape:

- ``_prepare_input_ids`` under async scheduling: vLLM's fast path needs one token a request,
  so a step with drafts builds four index lists in Python (a loop over the requests), uploads
  them and scatters the previous step's sampled and draft tokens into the input ids;
- ``_calc_spec_decode_metadata``: five index tensors (logits, target and bonus positions,
  cumulative draft and sampled counts) computed with numpy and uploaded.

A uniform step (every request a decode from the previous step, in the same row, with the same
number of drafts d; what our padded drafts and drafter graphs make of most steps on CUDA) needs
neither: the sampled token of row i goes to input position i*(1+d), its drafts to the d after
it, both strided copies on the device; and the five index tensors are the same for every step
of n requests with d drafts, so they are computed once by vLLM's own method and kept on the
device (up to 64 shapes, the least recently used dropped first). Anything else runs vLLM's code.

Nothing that reads the kept tensors writes into them (vLLM's rejection sampler and proposers,
ours: checked in vLLM 0.26); each step's ``draft_token_ids`` is a fresh tensor, as vLLM's is
(the late suffix drafts write into it). ``tests/test_uniform_step_inputs.py`` compares both
methods with vLLM's on random batches. ``SPECDEC_LEAN_STEP_INPUTS=0`` runs vLLM's code every
step (to time the two side by side, or as a way back).

Measured (H200, session 62, EAGLE and EAGLE-3 at synthetic acceptance 3.0, batch 1 and 16,
``ours`` against ``ours-full-inputs`` in one run): 0.99-1.03x of vLLM's path, within the
runs' spread. The uploads were not what held the step: it is nearly all device work
(BENCHMARKS.md, session 62). Kept on: fewer host calls and uploads a step for the same result.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from specdec_plugin import envs

# (requests, drafts) shapes whose index tensors are kept: a serving engine's batch size moves
# as requests come and go; each entry is a few small tensors.
_KEPT_SHAPES = 64
_INDEX_FIELDS = ("cu_num_draft_tokens", "cu_num_sampled_tokens", "target_logits_indices",
                 "bonus_logits_indices", "logits_indices")


def uniform_layout(cu_num_tokens: np.ndarray, num_reqs: int, drafts: int) -> bool:
    """Whether the cumulative token counts are those of num_reqs requests of 1 + drafts tokens."""
    return np.array_equal(cu_num_tokens[:num_reqs], np.arange(1, num_reqs + 1) * (1 + drafts))


class UniformStepInputsMixin:
    _specdec_lean_inputs: bool | None = None  # SPECDEC_LEAN_STEP_INPUTS, read at first use
    _specdec_kept_indices: OrderedDict | None = None

    def _lean_inputs(self) -> bool:
        if self._specdec_lean_inputs is None:
            self._specdec_lean_inputs = envs.lean_step_inputs()
        return self._specdec_lean_inputs

    # ---- input ids under async scheduling ----
    def _uniform_drafts(self, scheduler_output, num_reqs: int) -> int | None:
        """d if every one of the num_reqs requests carries d scheduled drafts (0: none does)."""
        spec = scheduler_output.scheduled_spec_decode_tokens
        if not spec:
            return 0
        if len(spec) != num_reqs:
            return None
        lengths = {len(tokens) for tokens in spec.values()}
        return lengths.pop() if len(lengths) == 1 else None

    def _uniform_rows(self, num_reqs: int, drafts: int) -> bool:
        """Whether every request sits in its previous step's row, whose sampled token and
        first ``drafts`` drafts the previous step left on the device."""
        if self.input_batch.prev_sampled_token_ids.shape[0] < num_reqs or not np.array_equal(
                self.prev_positions.np[:num_reqs], self.arange_np[:num_reqs]):
            return False
        previous = self._draft_token_ids
        return drafts == 0 or (isinstance(previous, torch.Tensor) and previous.dim() == 2
                               and previous.shape[0] >= num_reqs
                               and previous.shape[1] >= drafts)

    def _prepare_input_ids(self, scheduler_output, num_reqs: int,
                           total_num_scheduled_tokens: int, cu_num_tokens: np.ndarray) -> None:
        prev_sampled = self.input_batch.prev_sampled_token_ids
        if (not self._lean_inputs() or prev_sampled is None or num_reqs == 0
                or self.enable_prompt_embeds):
            return super()._prepare_input_ids(scheduler_output, num_reqs,
                                              total_num_scheduled_tokens, cu_num_tokens)
        drafts = self._uniform_drafts(scheduler_output, num_reqs)
        if drafts is None or not self._uniform_rows(num_reqs, drafts) \
                or total_num_scheduled_tokens != num_reqs * (1 + drafts) \
                or not uniform_layout(cu_num_tokens, num_reqs, drafts):
            return super()._prepare_input_ids(scheduler_output, num_reqs,
                                              total_num_scheduled_tokens, cu_num_tokens)
        # Row i's tokens sit at [i*(1+d), (i+1)*(1+d)): its sampled token, then its drafts,
        # the first d of the previous step's draft row i (vLLM's scatter, as strided copies).
        ids = self.input_ids.gpu[:total_num_scheduled_tokens].view(num_reqs, 1 + drafts)
        ids[:, 0].copy_(prev_sampled[:num_reqs, 0], non_blocking=True)
        if drafts:
            ids[:, 1:].copy_(self._draft_token_ids[:num_reqs, :drafts], non_blocking=True)

    # ---- the verification step's index tensors ----
    def _calc_spec_decode_metadata(self, num_draft_tokens: np.ndarray,
                                   cu_num_scheduled_tokens: np.ndarray) -> SpecDecodeMetadata:
        num_reqs = int(num_draft_tokens.shape[0])
        drafts = int(num_draft_tokens[0]) if num_reqs else 0
        if (not self._lean_inputs() or drafts == 0
                or not np.array_equal(num_draft_tokens, np.full(num_reqs, drafts))
                or not uniform_layout(cu_num_scheduled_tokens, num_reqs, drafts)):
            return super()._calc_spec_decode_metadata(num_draft_tokens, cu_num_scheduled_tokens)
        kept = self._specdec_kept_indices
        if kept is None:
            kept = self._specdec_kept_indices = OrderedDict()
        key = (num_reqs, drafts)
        indices = kept.get(key)
        if indices is None:
            meta = super()._calc_spec_decode_metadata(num_draft_tokens, cu_num_scheduled_tokens)
            kept[key] = {field: getattr(meta, field) for field in _INDEX_FIELDS}
            if len(kept) > _KEPT_SHAPES:
                kept.popitem(last=False)
            return meta
        kept.move_to_end(key)
        # Each request's drafts are its input ids after its first: vLLM gathers them through
        # the logits and target indices into a fresh tensor; a contiguous copy is the same.
        width = 1 + drafts
        ids = self.input_ids.gpu[:num_reqs * width].view(num_reqs, width)
        draft_token_ids = ids[:, 1:].clone(memory_format=torch.contiguous_format).view(-1)
        return SpecDecodeMetadata(draft_token_ids=draft_token_ids,
                                  num_draft_tokens=[drafts] * num_reqs, **indices)
