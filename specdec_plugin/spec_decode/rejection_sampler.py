"""vLLM's V1 rejection sampler with its Triton kernels replaced by ours from the kernel registry.

``SpecDecRejectionSampler`` keeps vLLM's ``RejectionSampler`` contract: output
``[batch, max_spec_len + 1]`` int32 with ``-1`` placeholders (``parse_output`` unchanged), bonus
tokens from the normal sampler, logits processors / penalties / bad words, temperature, top-k and
top-p on the target logits, logprobs, and "synthetic" acceptance. Only ``forward`` is overridden,
because vLLM's forward calls the module-level ``apply_sampling_constraints`` and
``rejection_sample``, which launch Triton; those two are re-implemented here on registry kernels.
The rest (``apply_logits_processors``, ``_get_logprobs_tensors``, ``generate_uniform_probs``,
which is plain torch) is vLLM's own.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
from vllm.v1.sample.rejection_sampler import (
    GREEDY_TEMPERATURE,
    MAX_SPEC_LEN,
    PLACEHOLDER_TOKEN_ID,
    RejectionSampler,
    generate_uniform_probs,
)
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from specdec_plugin.ops.registry import get_kernel

Providers = Sequence[str]


class SpecDecRejectionSampler(RejectionSampler):
    def __init__(self, sampler, spec_config=None, device=None, providers: Providers = ("torch",)):
        super().__init__(sampler, spec_config, device)
        self.providers = tuple(providers)

    def forward(
        self,
        metadata: SpecDecodeMetadata,
        draft_probs: torch.Tensor | None,  # [num_tokens, vocab] or None (ngram, greedy drafts)
        logits: torch.Tensor,  # [num_tokens + batch, vocab]; may be modified in place
        sampling_metadata: SamplingMetadata,
    ) -> SamplerOutput:
        assert metadata.max_spec_len <= MAX_SPEC_LEN
        if argmax_decides(sampling_metadata):
            return self._greedy_forward(metadata, logits, sampling_metadata)
        # Bonus tokens come from the ordinary sampler; it returns (processed) logits rather than
        # logprobs because the logprobs of accepted tokens are gathered from them below.
        bonus = self.sampler(
            logits=logits[metadata.bonus_logits_indices],
            sampling_metadata=replace(sampling_metadata, max_num_logprobs=-1),
            predict_bonus_token=True,
            logprobs_mode_override=(
                "processed_logits" if self.is_processed_logprobs_mode else "raw_logits"
            ),
        )
        # Indexing copies, so the in-place processing below leaves `logits` untouched.
        raw_target_logits = logits[metadata.target_logits_indices].to(torch.float32)
        target_logits = (
            raw_target_logits if self.is_processed_logprobs_mode else raw_target_logits.clone()
        )
        target_logits = self.apply_logits_processors(target_logits, sampling_metadata, metadata)
        target_logits = apply_sampling_constraints(
            target_logits, metadata.cu_num_draft_tokens, sampling_metadata, self.providers
        )
        output_token_ids = rejection_sample(
            metadata.draft_token_ids,
            metadata.num_draft_tokens,
            metadata.max_spec_len,
            metadata.cu_num_draft_tokens,
            draft_probs,
            target_logits,
            bonus.sampled_token_ids,
            sampling_metadata,
            synthetic_conditional_rates=self.synthetic_conditional_rates,
            use_fp64_gumbel=self.use_fp64_gumbel,
            providers=self.providers,
        )
        logprobs_tensors = None
        if sampling_metadata.max_num_logprobs is not None:
            logprobs_tensors = self._get_logprobs_tensors(
                sampling_metadata.max_num_logprobs,
                metadata,
                logits,
                target_logits if self.is_processed_logprobs_mode else raw_target_logits,
                bonus.logprobs_tensors.logprobs,
                output_token_ids,
            )
        return SamplerOutput(sampled_token_ids=output_token_ids, logprobs_tensors=logprobs_tensors)

    def _greedy_forward(self, metadata: SpecDecodeMetadata, logits: torch.Tensor,
                        sampling_metadata: SamplingMetadata) -> SamplerOutput:
        """Every request greedy and nothing that could move an argmax (``argmax_decides``): the
        target and bonus tokens are the raw logits' argmax. The general path gets the same
        tokens after a float32 copy of every row, a clone of the target rows and the ordinary
        sampler's pass over the bonus rows (with another float32 copy for logprobs nobody
        asked for): host work each step, and device work that grows with vocabulary x rows."""
        # One argmax over all rows, then each row's own: the rows are the step's sampled
        # positions, targets and bonuses interleaved per request.
        argmax = logits.argmax(dim=-1)
        bonus = argmax[metadata.bonus_logits_indices].to(torch.int32).unsqueeze(-1)
        output_token_ids = placeholder_output(len(metadata.num_draft_tokens),
                                              metadata.max_spec_len, logits.device)
        uniform_probs = None
        if self.synthetic_conditional_rates is not None:
            uniform_probs = generate_uniform_probs(
                metadata.draft_token_ids.shape[0], metadata.num_draft_tokens,
                sampling_metadata.generators, logits.device)
        get_kernel("rejection_greedy_sample", self.providers)(
            output_token_ids, metadata.cu_num_draft_tokens, metadata.draft_token_ids,
            argmax[metadata.target_logits_indices], bonus, None, metadata.max_spec_len,
            uniform_probs, self.synthetic_conditional_rates,
        )
        return SamplerOutput(sampled_token_ids=output_token_ids, logprobs_tensors=None)


# vLLM's built-in processors that can move an argmax, and the state that is empty when no
# request in the batch uses them (vllm/v1/sample/logits_processor/builtin.py).
_IDLE_WHEN_EMPTY = {"LogitBiasLogitsProcessor": "biases", "MinTokensLogitsProcessor": "min_toks"}


def argmax_decides(sampling_metadata: SamplingMetadata) -> bool:
    """Whether every token of this step is the argmax of the raw logits: all requests greedy,
    no logprobs, and nothing that edits logits before the argmax (penalties, bad words, allowed
    tokens, an active logits processor, a thinking budget). Unknown processors count as
    active."""
    m = sampling_metadata
    if not m.all_greedy or m.max_num_logprobs is not None or getattr(m, "logprob_token_ids", None):
        return False
    if not m.no_penalties or m.bad_words_token_ids or m.allowed_token_ids_mask is not None:
        return False
    holder = getattr(m, "thinking_budget_state_holder", None)
    if holder is not None and holder.has_tracked_requests():
        return False
    processors = m.logitsprocs.non_argmax_invariant if m.logitsprocs is not None else ()
    for processor in processors:
        state = _IDLE_WHEN_EMPTY.get(type(processor).__name__)
        if state is None or getattr(processor, state, True):
            return False
    return True


def placeholder_output(batch: int, max_spec_len: int, device) -> torch.Tensor:
    """``[batch, max_spec_len + 1]`` int32 of vLLM's placeholder, which the kernels overwrite
    with each request's tokens."""
    return torch.full((batch, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32,
                      device=device)


def expand_batch_to_tokens(
    x: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    num_tokens: int,
    replace_from: int | float = 0,
    replace_to: int | float = 0,
    providers: Providers = ("torch",),
) -> torch.Tensor:
    """``[batch]`` -> ``[num_tokens]``: each request's value repeated over its tokens."""
    assert cu_num_tokens.shape[0] == x.shape[0]
    out = x.new_empty(num_tokens)
    return get_kernel("expand_batch_to_tokens", tuple(providers))(
        out, x, cu_num_tokens, replace_from, replace_to
    )


def apply_sampling_constraints(
    logits: torch.Tensor,  # [num_tokens, vocab], float32, modified in place
    cu_num_draft_tokens: torch.Tensor,
    sampling_metadata: SamplingMetadata,
    providers: Providers = ("torch",),
) -> torch.Tensor:
    """Temperature, top-k and top-p of each draft token's request; greedy rows keep T = 1."""
    if sampling_metadata.all_greedy:
        return logits
    num_tokens = logits.shape[0]
    temperature = expand_batch_to_tokens(
        sampling_metadata.temperature, cu_num_draft_tokens, num_tokens,
        replace_from=GREEDY_TEMPERATURE, replace_to=1, providers=providers,
    )
    logits.div_(temperature.unsqueeze(-1))
    top_k = top_p = None
    if sampling_metadata.top_k is not None:
        top_k = expand_batch_to_tokens(
            sampling_metadata.top_k, cu_num_draft_tokens, num_tokens, providers=providers
        )
    if sampling_metadata.top_p is not None:
        top_p = expand_batch_to_tokens(
            sampling_metadata.top_p, cu_num_draft_tokens, num_tokens, providers=providers
        )
    return apply_top_k_top_p(logits, top_k, top_p)


def sample_recovered_tokens(
    num_draft_tokens: list[int],
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    sampling_metadata: SamplingMetadata,
    use_fp64_gumbel: bool = False,
    providers: Providers = ("torch",),
) -> torch.Tensor:
    """One recovered token per draft position (used only where that draft is rejected)."""
    batch = len(num_draft_tokens)
    dtype = torch.float64 if use_fp64_gumbel else torch.float32
    # One exponential vector per request, shared by its positions; seeded requests draw theirs
    # from their own generator, and only when they have drafts (reproducibility).
    q = torch.empty((batch, target_probs.shape[-1]), dtype=dtype, device=target_probs.device)
    q.exponential_()
    for i, generator in sampling_metadata.generators.items():
        if num_draft_tokens[i] > 0:
            q[i].exponential_(generator=generator)
    recovered = torch.empty_like(draft_token_ids)
    return get_kernel("sample_recovered_tokens", tuple(providers))(
        recovered, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
        q.reciprocal(),
    )


def rejection_sample(
    draft_token_ids: torch.Tensor,  # [num_tokens] int32
    num_draft_tokens: list[int],
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,  # [batch] int32, inclusive
    draft_probs: torch.Tensor | None,  # [num_tokens, vocab]
    target_logits: torch.Tensor,  # [num_tokens, vocab], constraints applied
    bonus_token_ids: torch.Tensor,  # [batch, 1]
    sampling_metadata: SamplingMetadata,
    synthetic_conditional_rates: torch.Tensor | None = None,
    use_fp64_gumbel: bool = False,
    providers: Providers = ("torch",),
) -> torch.Tensor:
    """``[batch, max_spec_len + 1]`` int32: accepted drafts, then the recovered / argmax token at
    the first rejection or the bonus token; ``-1`` elsewhere."""
    assert draft_token_ids.ndim == 1 and cu_num_draft_tokens.ndim == 1
    assert draft_probs is None or draft_probs.shape == target_logits.shape
    providers = tuple(providers)
    batch = len(num_draft_tokens)
    num_tokens = draft_token_ids.shape[0]
    device = target_logits.device
    synthetic = synthetic_conditional_rates is not None
    output_token_ids = placeholder_output(batch, max_spec_len, device)
    is_greedy = None
    if not sampling_metadata.all_greedy:
        is_greedy = sampling_metadata.temperature == GREEDY_TEMPERATURE

    uniform_probs = None
    if synthetic or not sampling_metadata.all_greedy:
        uniform_probs = generate_uniform_probs(
            num_tokens, num_draft_tokens, sampling_metadata.generators, device
        )

    if not sampling_metadata.all_random:
        get_kernel("rejection_greedy_sample", providers)(
            output_token_ids, cu_num_draft_tokens, draft_token_ids,
            target_logits.argmax(dim=-1), bonus_token_ids, is_greedy, max_spec_len,
            uniform_probs, synthetic_conditional_rates,
        )
        if sampling_metadata.all_greedy:
            return output_token_ids

    target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)
    recovered = sample_recovered_tokens(
        num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
        sampling_metadata, use_fp64_gumbel, providers,
    )
    assert uniform_probs is not None
    get_kernel("rejection_random_sample", providers)(
        output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
        bonus_token_ids, recovered, uniform_probs, is_greedy, max_spec_len,
        synthetic_conditional_rates,
    )
    return output_token_ids
