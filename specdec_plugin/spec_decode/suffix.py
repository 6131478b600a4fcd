"""SuffixDecoding proposer on our C++ suffix-tree index (csrc/), in place of arctic-inference.

Each running request has a suffix tree over its prompt and output; finished requests' outputs
stay in a global tree (up to ``suffix_decoding_max_cached_requests``), so a new request that
repeats earlier work is drafted from it. The draft length adapts per request: longer matches
speculate more (``max_spec_factor``), improbable continuations stop early (``min_token_prob``).
"""
from __future__ import annotations

from vllm.config import VllmConfig
from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

from specdec_plugin.spec_decode.suffix_index import SuffixIndex


class SpecDecSuffixProposer(SuffixDecodingProposer):
    def __init__(self, vllm_config: VllmConfig):  # noqa: the parent imports arctic-inference
        config = vllm_config.speculative_config
        self.num_speculative_tokens = config.num_speculative_tokens
        self.max_tree_depth = config.suffix_decoding_max_tree_depth
        self.max_spec_factor = config.suffix_decoding_max_spec_factor
        self.min_token_prob = config.suffix_decoding_min_token_prob
        self.max_model_len = vllm_config.model_config.max_model_len
        self.index = SuffixIndex(max_tree_depth=self.max_tree_depth,
                                 max_cached_requests=config.suffix_decoding_max_cached_requests)

    def _start(self, req_id: str, row: int, input_batch, num_tokens: int, num_sampled: int) -> None:
        if self.index.has_cached(req_id):  # the id came back (preempted and resumed)
            self.index.evict_cached(req_id)
        tokens = input_batch.token_ids_cpu[row]
        num_prompt = int(input_batch.num_prompt_tokens[row])
        self.index.start_request(req_id, tokens[:num_prompt])
        # A resumed request already has output before this step's tokens: index it too.
        earlier_output = tokens[num_prompt:num_tokens - num_sampled]
        if len(earlier_output):
            self.index.add_tokens(req_id, earlier_output)

    def propose(self, num_speculative_tokens: int, input_batch, sampled_token_ids: list[list[int]],
                slot_mappings=None) -> list[list[int]]:
        drafts: list[list[int]] = []
        # A plain step (the adaptive controller's k = 0) only indexes: every row's tokens in
        # one call after the loop (GIL released; each grows only its request's own trie).
        plain = num_speculative_tokens <= 0
        plain_ids: list[str] = []
        plain_tokens: list[list[int]] = []
        for row, sampled in enumerate(sampled_token_ids):
            num_tokens = int(input_batch.num_tokens_no_spec[row])
            if not sampled or num_tokens >= self.max_model_len:
                drafts.append([])
                continue
            req_id = input_batch.req_ids[row]
            if not self.index.has_request(req_id):
                self._start(req_id, row, input_batch, num_tokens, len(sampled))
            if plain:
                plain_ids.append(req_id)
                plain_tokens.append(sampled)
                drafts.append([])
                continue
            self.index.add_tokens(req_id, sampled)
            start = max(0, num_tokens - self.max_tree_depth)
            draft = self.index.speculate(
                req_id, input_batch.token_ids_cpu[row, start:num_tokens],
                max_spec_tokens=min(num_speculative_tokens, self.max_model_len - num_tokens - 1),
                max_spec_factor=self.max_spec_factor, min_token_prob=self.min_token_prob,
            )
            drafts.append(draft.token_ids)
        if plain_ids:
            self.index.add_tokens_batch(plain_ids, plain_tokens)
        # Requests that left the batch have finished: their output joins the global tree.
        for req_id in set(self.index.active_request_ids()) - input_batch.req_id_to_index.keys():
            self.index.stop_request(req_id)
        return drafts

    def load_model(self, *args, **kwargs) -> None:
        pass
