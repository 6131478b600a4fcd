"""Model-runner mixin: vLLM's async speculative bookkeeping left out where no draft was verified.

Why: under adaptive drafting most steps draft nothing (k = 0), and at batch 64 on an H200 the
speculative engine's host work per step is close enough to the ~5 ms device step that every
0.1 ms shows in the step period (BENCHMARKS.md, session 50: n-gram that drafted nothing ran
5.4% slower than plain decoding). A host profile of such steps (profile_engine.py --host-only,
session 51) found two pieces of vLLM 0.26's async speculative bookkeeping that run every step
and have nothing to do after a step that verified no drafts:

- ``_copy_valid_sampled_token_count`` copies each request's count of valid sampled tokens to
  the host on a side stream and records an event. The host copy is read in one place, the next
  step's correction of ``num_computed_tokens`` (``_get_valid_sampled_token_count``, called by
  ``correct_spec_decode_token_counts`` in ``_update_states``), and only for requests whose
  drafts the step verified (``prev_num_draft_len > 0``). A step that verified none skips the
  copy; the device-side results (the stashed counts and the next input ids) are kept.
- ``_prepare_inputs`` corrects ``num_computed_tokens`` on the device from the previous step's
  counts (``update_num_computed_tokens_for_batch_change``: two uploads, a host-to-device copy
  and a kernel). Where no request verified drafts in the previous step every row takes the
  host's value, which is what vLLM's other branch copies directly; dropping the stashed counts
  (``valid_sampled_token_count_gpu``, read only there) selects that branch.
  ``tests/test_plain_step_bookkeeping.py`` checks the equivalence on random batches.

Steps that verify drafts (probes included) run vLLM's code unchanged. Without async
speculative decoding (the CPU) neither method has work to skip. ``SPECDEC_LEAN_PLAIN_STEPS=0``
runs vLLM's code after every step (to time the two side by side, or as a way back).
"""
from __future__ import annotations

from specdec_plugin import envs


class PlainStepBookkeepingMixin:
    # Whether the step being executed verifies drafts: True until a step says otherwise, so
    # that anything unforeseen keeps vLLM's path.
    _specdec_verifies_drafts: bool = True
    _specdec_lean: bool | None = None  # SPECDEC_LEAN_PLAIN_STEPS, read at the first step

    def execute_model(self, scheduler_output, *args, **kwargs):
        if self._specdec_lean is None:
            self._specdec_lean = envs.lean_plain_steps()
        # The scheduler's reservation, before any trim (a trimmed-away draft still copies:
        # the safe side).
        self._specdec_verifies_drafts = bool(scheduler_output.scheduled_spec_decode_tokens)
        return super().execute_model(scheduler_output, *args, **kwargs)

    def _update_states(self, scheduler_output, *args, **kwargs):
        result = super()._update_states(scheduler_output, *args, **kwargs)
        # prev_num_draft_tokens.np: the previous step's verified drafts per row, filled by
        # vLLM's _update_states just now (zeros, then each request with drafts).
        if (self._specdec_lean and self.use_async_spec_decode
                and self.valid_sampled_token_count_gpu is not None
                and not self.prev_num_draft_tokens.np.any()):
            self.valid_sampled_token_count_gpu = None
        return result

    def _copy_valid_sampled_token_count(self, next_token_ids, valid_sampled_tokens_count):
        if (not self._specdec_lean or self._specdec_verifies_drafts
                or self.valid_sampled_token_count_event is None):
            return super()._copy_valid_sampled_token_count(next_token_ids,
                                                           valid_sampled_tokens_count)
        # vLLM's method less the host copy and its event (gpu_model_runner.py:4891-4911).
        if self.use_async_spec_decode:
            self.valid_sampled_token_count_gpu = valid_sampled_tokens_count
        self.input_batch.prev_sampled_token_ids = next_token_ids.unsqueeze(1)
