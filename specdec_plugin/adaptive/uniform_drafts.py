"""Uniform draft lengths for n-gram and suffix: on by default on CUDA GPUs.

Why: vLLM replays a full CUDA graph for a decode step only when every request in it verifies
the same number of drafts ("uniform decode"). The n-gram and suffix proposers draft what each
request's history matches, a different length per request, so their speculative steps run
piecewise graphs, with attention outside the graph. On the H100 (SmolLM2 padded to 7B, real
prompts, BENCHMARKS.md session 14) such steps cost about twice a plain step, and n-gram and
suffix ran at 0.53-0.77x of plain decoding from batch 4 up, while EAGLE-3 (always k drafts)
ran at 1.16-1.60x.

What: when the drafts of a step arrive at the scheduler (``update_draft_token_ids``, the
synchronous path these proposers take), each decode request's draft is padded to the length
the step asked for (``num_spec_tokens_to_schedule``, the adaptive controller's k) with filler
tokens: its last token, repeated. The next step then verifies 1+k tokens for every request.

Lossless: a filler token is verified like any draft. Greedy: it is kept only where it is the
target's own choice. Sampling: n-gram and suffix drafts carry no probabilities, and vLLM's
rejection sampler accepts a one-hot proposal with the target's probability of that token,
which leaves the output distribution the target's whatever the proposal.

Counting: filler slots are not drafts. They reach vLLM's metrics as invalid spec tokens,
the way the device n-gram path's empty slots do, so ``spec_decode_*`` counts real drafts
only. The adaptive controller does count them, as drafted tokens that were (almost always)
rejected: in a padded step every request pays for k slots, so the acceptance it learns per
request is the value of a slot.

The device n-gram path (method "ngram_gpu", the GPU default for "ngram") gets the same under
the same switch elsewhere: there the scheduler already reserves k slots for every request, and
vLLM's runner trims the unmatched ones (after waiting on the host for the previous step's
match counts); the runner instead verifies them with filler and reports them
(spec_decode/ngram_device.py, ``fill_unmatched`` and ``NgramTrimReportMixin``).

Suffix decoding under async scheduling (``SPECDEC_SUFFIX_ASYNC``) pads in the runner, where its
drafts are made (spec_decode/suffix_async_runner.py).

``SPECDEC_UNIFORM_DRAFTS``: the CUDA device layer sets it to 1 (measured on the H100, session
15: better than ragged drafts in all 16 cells of the real-prompt run, BENCHMARKS.md); 0 turns
it off. On the CPU there are no graphs, so padding only adds verification work: off there.
"""
from __future__ import annotations

from vllm.v1.outputs import DraftTokenIds

from specdec_plugin import envs
from specdec_plugin.spec_decode.ngram_device import FILLER_DRAFTS

# The methods whose drafts reach the scheduler as host lists (vLLM's synchronous path).
PADDED_METHODS = frozenset({"ngram", "suffix"})
# Where the filler counts of a step ride from ``schedule`` to ``update_from_output``.
FILLER_SLOTS = "_specdec_filler_slots"


def uniform_drafts_enabled(vllm_config) -> bool:
    spec = vllm_config.speculative_config
    return (envs.uniform_drafts() and spec is not None and spec.method in PADDED_METHODS
            and not vllm_config.scheduler_config.async_scheduling)


def add_invalid_spec_tokens(scheduler_output, slots: dict[str, int]) -> None:
    """Count ``slots`` (request id -> draft slots) as vLLM's invalid spec tokens of the step:
    its counters then leave them out of the drafts."""
    if not slots:
        return
    invalid = dict(scheduler_output.num_invalid_spec_tokens or {})
    for req_id, n in slots.items():
        invalid[req_id] = invalid.get(req_id, 0) + n
    scheduler_output.num_invalid_spec_tokens = invalid


def padded_draft(draft: list[int], k: int, filler: int) -> list[int]:
    """``draft`` extended to ``k`` tokens with ``filler`` (never shortened)."""
    return list(draft) + [filler] * (k - len(draft)) if len(draft) < k else list(draft)


class UniformDraftsMixin:
    """Mixed into a vLLM scheduler (before ``Scheduler`` in the bases). Pads host drafts
    where ``uniform_drafts_enabled``, and accounts for filler slots from either source: its
    own padding and the device n-gram runner's (``FILLER_DRAFTS`` on the step's output)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pad_drafts = uniform_drafts_enabled(self.vllm_config)
        self._asked_k = 0
        self._real_draft_len: dict[str, int] = {}  # request id -> real tokens of its drafts
        self._filler_now: dict[str, int] = {}  # filler slots of the step being accounted

    def filler_slots(self, req_id: str) -> int:
        """Filler slots of ``req_id`` in the step whose output is being processed."""
        return self._filler_now.get(req_id, 0)

    def schedule(self, *args, **kwargs):
        out = super().schedule(*args, **kwargs)
        if not self._pad_drafts:
            return out
        # The drafts proposed after this step are asked for this length.
        self._asked_k = out.num_spec_tokens_to_schedule or 0
        filler = {}
        for req_id, spec in out.scheduled_spec_decode_tokens.items():
            real = self._real_draft_len.pop(req_id, None)
            if real is not None and len(spec) > real:
                filler[req_id] = len(spec) - real
        add_invalid_spec_tokens(out, filler)
        setattr(out, FILLER_SLOTS, filler)
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        filler = dict(getattr(scheduler_output, FILLER_SLOTS, None) or {})
        from_runner = getattr(model_runner_output, FILLER_DRAFTS, None) or {}
        add_invalid_spec_tokens(scheduler_output, from_runner)
        for req_id, n in from_runner.items():
            filler[req_id] = filler.get(req_id, 0) + n
        self._filler_now = filler
        try:
            return super().update_from_output(scheduler_output, model_runner_output)
        finally:
            self._filler_now = {}

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        if self._pad_drafts and self._asked_k > 0:
            draft_token_ids = DraftTokenIds(
                draft_token_ids.req_ids,
                [self._pad(req_id, list(draft)) for req_id, draft
                 in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids)])
        super().update_draft_token_ids(draft_token_ids)

    def _pad(self, req_id: str, draft: list[int]) -> list[int]:
        request = self.requests.get(req_id)
        if (request is None or request.is_finished() or request.is_prefill_chunk
                or request.structured_output_request is not None):
            return draft  # vLLM drops these drafts, or a grammar must check every token
        # The proposers' own cap: no draft past the model's length.
        k = min(self._asked_k, self.max_model_len - request.num_tokens - 1)
        if len(draft) >= k:
            self._real_draft_len.pop(req_id, None)
            return draft
        self._real_draft_len[req_id] = len(draft)
        return padded_draft(draft, k, request.all_token_ids[-1])

    def make_spec_decoding_stats(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
                                 num_invalid_spec_tokens, request_id):
        filler = self.filler_slots(request_id)
        if filler:
            # A filler the target happened to choose is not an accepted draft.
            invalid = (num_invalid_spec_tokens or {}).get(request_id, 0)
            num_accepted_tokens = min(num_accepted_tokens, max(num_draft_tokens - invalid, 0))
        return super().make_spec_decoding_stats(spec_decoding_stats, num_draft_tokens,
                                                num_accepted_tokens, num_invalid_spec_tokens,
                                                request_id)

    def _free_request(self, request, *args, **kwargs):
        self._real_draft_len.pop(request.request_id, None)
        return super()._free_request(request, *args, **kwargs)
