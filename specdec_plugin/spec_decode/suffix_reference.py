"""Pure-Python SuffixDecoding index: the executable specification of csrc/suffix_tree.h.

Deliberately naive (dict tries, anchors found by re-walking from the root, no suffix links) so
that it is easy to check by eye; the C++ index must return identical drafts, probabilities
(bit-for-bit: same float operations in the same order) and cache contents.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Sequence

from specdec_plugin.spec_decode.suffix_index import SuffixDraft

_EMPTY = SuffixDraft([], [], 0, 0.0)


class _Node:
    __slots__ = ("count", "child_total", "children")

    def __init__(self) -> None:
        self.count = 0  # occurrences of this node's string
        self.child_total = 0  # occurrences followed by a token within the depth cap
        self.children: dict[int, _Node] = {}


class ReferenceTrie:
    """Counts every substring of length <= max_depth of every inserted stream."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = _Node()

    def insert(self, tokens: Sequence[int]) -> None:
        tokens = [int(t) for t in tokens]
        for start in range(len(tokens)):
            node = self.root
            for tok in tokens[start:start + self.max_depth]:
                child = node.children.setdefault(tok, _Node())
                child.count += 1
                node.child_total += 1
                node = child

    def count_ending_at(self, tokens: Sequence[int], end: int) -> None:
        """Count the substrings ending at ``tokens[end]`` (the stream grew by that token)."""
        for start in range(max(0, end - self.max_depth + 1), end + 1):
            node = self._walk(tokens[start:end])  # present: counted at an earlier end
            child = node.children.setdefault(int(tokens[end]), _Node())
            child.count += 1
            node.child_total += 1

    def remove(self, tokens: Sequence[int]) -> None:
        tokens = [int(t) for t in tokens]
        for start in range(len(tokens)):
            node = self.root
            for tok in tokens[start:start + self.max_depth]:
                child = node.children[tok]
                child.count -= 1
                node.child_total -= 1
                if child.count == 0:
                    del node.children[tok]
                    break
                node = child

    def num_nodes(self) -> int:
        stack, total = [self.root], 0
        while stack:
            node = stack.pop()
            total += 1
            stack.extend(node.children.values())
        return total

    def _walk(self, tokens: Sequence[int]) -> _Node | None:
        node = self.root
        for tok in tokens:
            node = node.children.get(tok)
            if node is None:
                return None
        return node

    def anchor(self, seq: Sequence[int]) -> tuple[_Node | None, int]:
        """Longest suffix of ``seq`` whose node has a continuation, and its length."""
        for length in range(min(len(seq), self.max_depth - 1), 0, -1):
            node = self._walk(seq[len(seq) - length:])
            if node is not None and node.child_total > 0:
                return node, length
        return None, 0

    def speculate(self, context: Sequence[int], max_spec_tokens: int, max_spec_factor: float,
                  min_token_prob: float) -> SuffixDraft:
        seq = [int(t) for t in context]
        node, match_len = self.anchor(seq)
        if node is None:
            return _EMPTY
        limit = min(max_spec_tokens, math.floor(max_spec_factor * match_len + 1e-9))
        tokens: list[int] = []
        probs: list[float] = []
        cum, score = 1.0, 0.0
        while len(tokens) < limit:
            # Most frequent child; ties go to the smallest token id.
            tok, child = min(node.children.items(), key=lambda kv: (-kv[1].count, kv[0]))
            nxt = cum * (child.count / node.child_total)
            if nxt < min_token_prob:
                break
            cum = nxt
            tokens.append(tok)
            probs.append(cum)
            score += cum
            seq.append(tok)
            node, _ = self.anchor(seq)
            if node is None:
                break
        return SuffixDraft(tokens, probs, match_len, score)


class ReferenceSuffixIndex:
    """Same API and results as :class:`specdec_plugin.spec_decode.suffix_index.SuffixIndex`."""

    def __init__(self, max_tree_depth: int = 24, max_cached_requests: int = 10000):
        self.max_tree_depth = max_tree_depth
        self.max_cached_requests = max_cached_requests
        self.global_trie = ReferenceTrie(max_tree_depth)
        self._local: dict[str, ReferenceTrie] = {}
        self._tokens: dict[str, list[int]] = {}
        self._prompt_len: dict[str, int] = {}
        self._cached: OrderedDict[str, list[int]] = OrderedDict()  # oldest first

    def start_request(self, req_id, prompt_tokens) -> None:
        req_id = str(req_id)
        if req_id in self._local:
            raise ValueError(f"request already active: {req_id}")
        tokens = [int(t) for t in prompt_tokens]
        self._local[req_id] = ReferenceTrie(self.max_tree_depth)
        self._local[req_id].insert(tokens)
        self._tokens[req_id] = tokens
        self._prompt_len[req_id] = len(tokens)

    def add_tokens(self, req_id, new_tokens) -> None:
        req_id = str(req_id)
        tokens = self._tokens[req_id]
        old_len = len(tokens)
        tokens.extend(int(t) for t in new_tokens)
        for end in range(old_len, len(tokens)):
            self._local[req_id].count_ending_at(tokens, end)

    def stop_request(self, req_id) -> None:
        req_id = str(req_id)
        del self._local[req_id]
        tokens = self._tokens.pop(req_id)
        prompt_len = self._prompt_len.pop(req_id)
        if self.max_cached_requests == 0 or len(tokens) == prompt_len:
            return
        self.evict_cached(req_id)
        lead_in = min(prompt_len, self.max_tree_depth - 1)
        entry = tokens[prompt_len - lead_in:]
        self.global_trie.insert(entry)
        self._cached[req_id] = entry
        while len(self._cached) > self.max_cached_requests:
            _, oldest = self._cached.popitem(last=False)
            self.global_trie.remove(oldest)

    def evict_cached(self, req_id) -> None:
        entry = self._cached.pop(str(req_id), None)
        if entry is not None:
            self.global_trie.remove(entry)

    def speculate(self, req_id, context, max_spec_tokens, max_spec_factor=1.0,
                  min_token_prob=0.1) -> SuffixDraft:
        req_id = str(req_id)
        if context is None:
            context = self._tokens[req_id][-self.max_tree_depth:]
        best = self._local[req_id].speculate(context, max_spec_tokens, max_spec_factor,
                                             min_token_prob)
        if self.max_cached_requests > 0 and self._cached:
            other = self.global_trie.speculate(context, max_spec_tokens, max_spec_factor,
                                               min_token_prob)
            if other.score > best.score:
                best = other
        return best

    def has_request(self, req_id) -> bool:
        return str(req_id) in self._local

    def has_cached(self, req_id) -> bool:
        return str(req_id) in self._cached

    def num_cached_requests(self) -> int:
        return len(self._cached)

    def cached_request_ids(self) -> list[str]:
        return list(self._cached)


def repetitive_token_stream(rng, n: int, alphabet: int) -> list[int]:
    """Random tokens that often copy an earlier stretch, so long matches and branches occur
    (test and benchmark input; ``rng`` is a ``random.Random``)."""
    out: list[int] = []
    while len(out) < n:
        if out and rng.random() < 0.5:
            start = rng.randrange(len(out))
            out.extend(out[start:start + rng.randint(1, 12)])
        else:
            out.append(rng.randrange(alphabet))
    return out[:n]
