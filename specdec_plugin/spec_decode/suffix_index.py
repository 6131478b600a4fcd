"""SuffixDecoding index (arXiv 2411.04975) backed by the C++ class in csrc/suffix_tree.h.

One local suffix trie per live request (prompt + generated tokens) and one global trie over the
finished requests (each stored as its last ``max_tree_depth - 1`` prompt tokens followed by its
response), capped FIFO at ``max_cached_requests`` whole requests (0 disables it). Tries count
every substring of length <= ``max_tree_depth``.

``speculate`` finds, in each trie, the longest suffix of the context that has a continuation,
then walks greedily to the most frequent child (ties: smallest token id) multiplying
``count(child) / sum(count(children))``; it stops before a token whose cumulative probability
would fall below ``min_token_prob``, or at ``min(max_spec_tokens, floor(max_spec_factor *
match_len))`` tokens. When the walk reaches a node without continuation (the depth cap) it falls
back to the longest suffix of context + draft that has one. The draft with the higher score
(sum of cumulative probabilities) wins; ties keep the local draft.
:mod:`specdec_plugin.spec_decode.suffix_reference` is the pure-Python statement of the same rules.
"""
from __future__ import annotations

import os
from typing import NamedTuple, Sequence

import numpy as np

from specdec_plugin.spec_decode._native import load_extension

TokenIds = Sequence[int] | np.ndarray


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the CPUs this process may run on
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1


def _as_list(tokens: TokenIds) -> list[int]:
    return tokens.tolist() if isinstance(tokens, np.ndarray) else list(tokens)


class SuffixDraft(NamedTuple):
    token_ids: list[int]
    probs: list[float]  # cumulative probability after each token
    match_len: int
    score: float  # sum(probs)


class SuffixIndex:
    """Python face of ``specdec_plugin._C.SuffixIndex``; request ids may be str or int."""

    __slots__ = ("_impl",)

    def __init__(self, max_tree_depth: int = 24, max_cached_requests: int = 10000):
        if max_tree_depth < 1:
            raise ValueError(f"max_tree_depth={max_tree_depth} must be >= 1")
        if max_cached_requests < 0:
            raise ValueError(f"max_cached_requests={max_cached_requests} must be >= 0")
        self._impl = load_extension().SuffixIndex(max_tree_depth, max_cached_requests)

    @property
    def max_tree_depth(self) -> int:
        return self._impl.max_tree_depth

    @property
    def max_cached_requests(self) -> int:
        return self._impl.max_cached_requests

    def start_request(self, req_id: str | int, prompt_tokens: TokenIds) -> None:
        """Build the request's local trie from its prompt. ValueError if already active."""
        self._impl.start_request(str(req_id), prompt_tokens)

    def prepare_requests(self, histories: Sequence[tuple[TokenIds, TokenIds]],
                         threads: int | None = None) -> list:
        """Local tries for requests about to start, built apart from the index (GIL released,
        on up to ``threads`` threads; default: half the CPUs, at most 8), from each request's
        ``(prompt, output so far)``. ``start_prepared`` then starts each, as ``start_request``
        and ``add_tokens`` would have."""
        if threads is None:
            threads = max(1, min(8, _usable_cpus() // 2))
        prompts = [_as_list(prompt) for prompt, _ in histories]
        outputs = [_as_list(output) for _, output in histories]
        return self._impl.prepare_requests(prompts, outputs, threads)

    def start_prepared(self, req_id: str | int, prepared) -> None:
        """Start a request from its ``prepare_requests`` trie (each starts once). ValueError if
        the id is already active."""
        self._impl.start_prepared(str(req_id), prepared)

    def add_tokens(self, req_id: str | int, new_tokens: TokenIds) -> None:
        """Append generated tokens to the local trie and the pending response. KeyError if unknown."""
        self._impl.add_tokens(str(req_id), new_tokens)

    def add_tokens_batch(self, req_ids: Sequence[str | int],
                         tokens: Sequence[Sequence[int]]) -> None:
        """``add_tokens`` for several requests in one call (a step's rows), the tries grown
        with the GIL released. KeyError, before any change, if an id is unknown."""
        self._impl.add_tokens_batch([str(r) for r in req_ids], tokens)

    def stop_request(self, req_id: str | int) -> None:
        """Drop the local trie and move the response (if any) into the global cache."""
        self._impl.stop_request(str(req_id))

    def evict_cached(self, req_id: str | int) -> None:
        """Remove a finished request's response from the global cache; no-op if absent."""
        self._impl.evict_cached(str(req_id))

    def speculate(
        self,
        req_id: str | int,
        context: TokenIds | None,
        max_spec_tokens: int,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
    ) -> SuffixDraft:
        """Draft for an active request; ``context=None`` uses its own last max_tree_depth tokens."""
        return SuffixDraft(
            *self._impl.speculate(str(req_id), context, max_spec_tokens, max_spec_factor,
                                  min_token_prob)
        )

    def speculate_batch(
        self,
        req_ids: Sequence[str | int],
        max_spec_tokens: Sequence[int],
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
    ) -> list[list[int]]:
        """Token ids only, one list per request, each from the request's own tokens."""
        return self._impl.speculate_batch([str(r) for r in req_ids], list(max_spec_tokens),
                                          max_spec_factor, min_token_prob)

    def has_request(self, req_id: str | int) -> bool:
        return self._impl.has_request(str(req_id))

    def has_cached(self, req_id: str | int) -> bool:
        return self._impl.has_cached(str(req_id))

    def num_active_requests(self) -> int:
        return self._impl.num_active_requests()

    def num_cached_requests(self) -> int:
        return self._impl.num_cached_requests()

    def active_request_ids(self) -> list[str]:
        return self._impl.active_request_ids()

    def cached_request_ids(self) -> list[str]:
        """Oldest first (the next to be evicted)."""
        return self._impl.cached_request_ids()

    def global_num_nodes(self) -> int:
        return self._impl.global_num_nodes()

    def check_invariants(self) -> str:
        """Full consistency scan of every trie (for tests); "" when consistent."""
        return self._impl.check_invariants()
