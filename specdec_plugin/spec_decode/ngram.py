"""Prompt-lookup (n-gram) proposer on our C++ n-gram index.

It subclasses vLLM's ``NgramProposer`` only so the V1 runner's type checks accept it; none of
the parent's state (numba buffers, JIT warm-up) is used. Drafts equal vLLM's: the longest
n-gram in [prompt_lookup_min, prompt_lookup_max] that occurred before, earliest occurrence.
"""
from __future__ import annotations

import numpy as np
from vllm.config import VllmConfig
from vllm.v1.spec_decode.ngram_proposer import NgramProposer

from specdec_plugin.spec_decode.ngram_index import ngram_propose_batch


class SpecDecNgramProposer(NgramProposer):
    def __init__(self, vllm_config: VllmConfig):  # noqa: super().__init__ deliberately skipped
        spec = vllm_config.speculative_config
        self.min_n = spec.prompt_lookup_min
        self.max_n = spec.prompt_lookup_max
        self.k = spec.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len

    def propose(self, num_speculative_tokens: int, sampled_token_ids: list[list[int]],
                num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings=None) -> list[list[int]]:
        # Requests still prefilling (nothing sampled) or already at the length limit get none.
        rows = [i for i, sampled in enumerate(sampled_token_ids)
                if sampled and num_tokens_no_spec[i] < self.max_model_len]
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        if rows and num_speculative_tokens > 0:  # 0: the adaptive controller's plain step
            found = ngram_propose_batch(token_ids_cpu, num_tokens_no_spec, rows, self.min_n,
                                        self.max_n, num_speculative_tokens, self.max_model_len)
            for row, draft in zip(rows, found):
                drafts[row] = draft
        return drafts

    def load_model(self, *args, **kwargs) -> None:
        pass
