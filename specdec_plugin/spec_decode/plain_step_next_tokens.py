"""The drafter's next-token inputs of a plain decode step, without vLLM's per-request loop.

Why: after every target step, vLLM's EAGLE-family and draft-model runners call the drafter's
``prepare_next_token_ids_padded``: a Python loop over every request (the "backup" token of
requests whose sample is discarded) and then a kernel that picks each request's last valid
sampled token and counts them. Under adaptive drafting most steps draft nothing (k = 0), and
at batch 64 on an H200 the speculative engine's host work per step came within about 0.6 ms of
the 5.1 ms device step (session 32, SPECDEC_STEP_LOG): each step's host time counts.

What: in a step that verified no drafts (one sampled token per request) and discards no
request's sample, the kernel's answer is known without running it: every request's next token
is its one sampled token, and one token is valid. Both are computed here with two tensor ops;
any other step (drafts verified, a chunked prefill's discarded sample, rows that are not the
batch's) runs vLLM's function as before. ``tests/test_plain_step_next_tokens.py`` compares the
two on random batches.

Where the runner's discard mask is not known on the host (no runner was passed), vLLM's
function always runs.
"""
from __future__ import annotations

import numpy as np
import torch


def plain_step_next_tokens(sampled_token_ids: torch.Tensor, num_reqs: int,
                           discard_mask: np.ndarray | None
                           ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(next_token_ids, valid_sampled_tokens_count)`` as vLLM's
    ``prepare_next_token_ids_padded`` returns them (int32, one per row), or None where this
    step is not a plain one: more than one sampled token per row, rows that are not the
    batch's requests, or a request whose sample is discarded."""
    if (discard_mask is None or sampled_token_ids.dim() != 2 or sampled_token_ids.shape[1] != 1
            or sampled_token_ids.shape[0] != num_reqs or bool(discard_mask[:num_reqs].any())):
        return None
    # A copy, as the kernel writes a fresh tensor: vLLM keeps it as the next step's input ids.
    next_token_ids = sampled_token_ids[:, 0].to(torch.int32, copy=True)
    return next_token_ids, torch.ones_like(next_token_ids)


class PlainStepNextTokens:
    """Mixin for vLLM's EAGLE-family and draft-model proposers (before vLLM's class in the
    bases): plain decode steps take ``plain_step_next_tokens``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._discard_mask_runner = kwargs.get("runner")

    def prepare_next_token_ids_padded(self, sampled_token_ids, requests, gpu_input_batch,
                                      discard_request_mask):
        runner = self._discard_mask_runner
        # The runner's host copy of the mask it just sent to the device (set for this step in
        # its _prepare_inputs): reading it costs no device sync.
        mask = getattr(getattr(runner, "discard_request_mask", None), "np", None)
        fast = plain_step_next_tokens(sampled_token_ids, gpu_input_batch.num_reqs, mask)
        if fast is not None:
            return fast
        return super().prepare_next_token_ids_padded(sampled_token_ids, requests,
                                                     gpu_input_batch, discard_request_mask)
