"""How much device memory our drafter graphs may take, reserved before vLLM sizes the KV cache.

Why: drafter graphs (drafter_graphs.py) are recorded lazily, per batch shape, while the engine
serves, long after vLLM gave every byte it was allowed (``gpu_memory_utilization``) to the KV
cache. vLLM's profiler sees none of them. Without a reservation a server at 0.95 runs out of
memory the first time a large batch records its graph.

What a recording holds on the device:
- its static input buffers (the inputs ``propose`` reads, copied in before each replay), one
  set per graph, from the ordinary allocator;
- the graph's working memory, in the private pool all our graphs share: they replay one after
  another, so the pool grows to about the largest graph's working set, not the sum;
- the eager warm-up pass before recording runs on our side stream, and the caching allocator
  keeps what it freed there for that stream: again about one largest working set.

So the reservation is ``PEAK_COPIES`` working sets of the largest decode shape (at least
``MIN_WORKING_SET`` each; one more than the two copies above, for the allocator's rounding,
see ``PEAK_COPIES``) plus
``STATIC_COPIES`` static-buffer sets of that shape (``GraphMemoryBudget.for_largest_shape``).
The working set is measured at start-up (the drafter's own forward passes at that shape, plus
its logits), the buffers are computed from the shapes. A recording is refused when its
buffers and what earlier recordings used (the pool's measured growth and their buffers) would
no longer fit the whole reservation; that shape then drafts eagerly (as a failed recording
does), so the reservation is a bound, not a hope. The two parts are sized separately but held
back as one sum, so a pool that outgrows its part may use what the buffers left: padded
graphs (drafter_padding.py) share one buffer set, and their first recording, the largest
shape, grew the pool by 112 MiB against a 94 MiB part (padded 7B EAGLE-3, H200, 2026-11-25),
which under per-part limits refused every later one.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# The graph pool and the side stream's cache: one largest working set each, and one more
# because the pool grows by whole allocator segments, past the measured working set. Measured
# on the H100 (session 26, random-7B benchmark): EAGLE's drafter measured a 50 MiB working set
# (64 MiB counted), and its first padded graph (64 requests, k = 0) took 155 MiB with its
# buffers against the 148 MiB two copies held back, which then refused the 59 other graphs:
# that engine drafted eagerly. EAGLE-3 on the same model (47 MiB measured) recorded all 60.
PEAK_COPIES = 3
# The least working set counted. The caching allocator grows a pool by whole segments (20 MiB
# for the blocks of 1-10 MiB that a small drafter allocates), so a small model's graph takes
# several segments whatever its measured working set. Measured on the H100 (session 25): the
# 2-layer draft model of the random-7B benchmark measured 24 MiB, its first padded graph (64
# requests, k = 0) grew the pool by 87 MiB against a 69 MiB reservation, which then refused
# every other graph. 64 MiB per copy holds back 192 MiB (three copies): nothing beside a KV
# cache of tens of GiB. EAGLE-3 on the same model (47 MiB measured) recorded all 60 graphs in
# 155 MiB (session 25).
MIN_WORKING_SET = 64 * 2**20
# Static input buffers are per graph. A smaller batch's buffers cost proportionally less, so
# this many largest-shape sets pay for many more graphs of the shapes traffic usually has.
STATIC_COPIES = 8


@dataclass(frozen=True)
class DecodeShape:
    """The largest decode step the drafter can be asked to draft for (the graph key's sizes)."""

    num_reqs: int
    num_tokens: int  # target tokens of the step: every request verifies K drafts


def largest_decode_shape(max_num_reqs: int, max_num_tokens: int, k: int) -> DecodeShape:
    """Recorded steps have queries of at most 1+K tokens (longer ones draft eagerly), so the
    largest is as many full 1+K queries as the token budget allows."""
    query_len = 1 + k
    num_reqs = max(1, min(max_num_reqs, max_num_tokens // query_len))
    return DecodeShape(num_reqs, num_reqs * query_len)


def static_input_bytes(shape: DecodeShape, hidden_width: int, hidden_dtype: torch.dtype,
                       max_blocks_per_req: int) -> int:
    """Bytes of one graph's static inputs at ``shape`` (drafter_graphs._ProposeCall.tensors:
    token ids, positions, hidden states, next token ids, indices to sample, rejected counts,
    query start locations, sequence lengths, block table, slot mapping). Index dtypes are
    taken at their widest (int64) so the estimate does not fall short."""
    n, t = shape.num_reqs, shape.num_tokens
    index_elems = (t + t  # token ids, positions
                   + n + n + n  # next token ids, indices to sample, rejected
                   + (n + 1) + n  # query start locations, sequence lengths
                   + n * max_blocks_per_req  # block table
                   + t)  # slot mapping
    hidden = t * hidden_width * torch.empty((), dtype=hidden_dtype).element_size()
    return index_elems * 8 + hidden


def logits_bytes(num_reqs: int, vocab_size: int) -> int:
    """One drafting step's logits for every request, and a float32 copy of them (sampling)."""
    return num_reqs * vocab_size * 4 * 2


class GraphMemoryBudget:
    """The bytes reserved for drafter graphs at start-up, in the two parts they were sized
    for, and what recordings have used of each.

    - working: the graph pool and the side stream's cache, charged with what the allocator
      grew by across a recording beyond its static buffers. It grows towards the largest
      working set once, then later recordings reuse it.
    - static: each graph's own input buffers, known before recording.
    A recording is allowed while both together, its buffers included, fit the sum.
    """

    def __init__(self, working_limit: int, static_limit: int) -> None:
        self.working_limit, self.static_limit = int(working_limit), int(static_limit)
        self.working_used = 0
        self.static_used = 0
        self.recordings = 0

    @classmethod
    def for_largest_shape(cls, working_set: int, static_bytes: int) -> "GraphMemoryBudget":
        return cls(PEAK_COPIES * max(working_set, MIN_WORKING_SET),
                   STATIC_COPIES * max(static_bytes, 0))

    @property
    def limit(self) -> int:
        return self.working_limit + self.static_limit

    @property
    def used(self) -> int:
        return self.working_used + self.static_used

    def allows(self, static_bytes: int) -> bool:
        return self.used + static_bytes <= self.limit

    def charge_buffers(self, nbytes: int) -> None:
        """Input buffers made outside any one recording (the padded graphs share one set)."""
        self.static_used += int(nbytes)

    def charge(self, grown: int, static_bytes: int) -> None:
        """``grown``: what the allocator reserved across the recording (buffers included)."""
        self.static_used += static_bytes
        self.working_used += max(int(grown) - static_bytes, 0)
        self.recordings += 1


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)
