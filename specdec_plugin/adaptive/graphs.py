"""Full graphs for every draft length the controller may choose (graph devices only).

vLLM's V1 runner captures full decode graphs for one query length, 1+K: a batch whose
requests each verify fewer drafts (or none) is not "uniform decode" to it and falls back to
piecewise graphs, which is why vLLM turns full graphs off entirely for its own dynamic draft
lengths. We keep one extra dispatcher per query length q = 1..K (0..K-1 drafts), each with
full decode keys at n*q tokens for the same request counts n as vLLM's 1+K graphs, and:

- capture: the runner's dispatcher (``QueryLengthDispatcher``) lists every dispatcher's keys
  when asked what to capture, so vLLM's graph-memory estimate counts them too;
  each capture runs with the runner's query length and dispatcher set to that key's q;
- each step: a batch in which every request has the same query length q selects q's
  dispatcher for vLLM's dispatch, and so replays q's full graph.

Keys of different q never collide: a key holds both the token count and the request count.
The count of graphs is (K+1) times vLLM's decode graphs, bounded by its capture sizes.
"""
from __future__ import annotations

import contextlib
import copy

from vllm.config.compilation import CUDAGraphMode
from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

from specdec_plugin.adaptive.config import adaptive_enabled
from specdec_plugin.log import init_logger

logger = init_logger(__name__)


def _decode_request_counts(sizes: list[int], query_len: int) -> list[int]:
    return sorted({s // query_len for s in sizes if s % query_len == 0})


def query_len_dispatchers(vllm_config, mode, k: int, max_num_tokens: int) -> dict[int, CudagraphDispatcher]:
    """One dispatcher per query length q = 1..K, holding only the uniform full decode keys at
    n*q tokens for the request counts n of vLLM's own (1+K)-token decode graphs."""
    base = vllm_config.compilation_config
    counts = _decode_request_counts(base.cudagraph_capture_sizes, 1 + k)
    dispatchers = {}
    for q in range(1, 1 + k):
        sizes = [n * q for n in counts if n * q <= max_num_tokens]
        if not sizes:
            continue
        compilation = copy.copy(base)
        compilation.cudagraph_capture_sizes = sizes
        compilation.max_cudagraph_capture_size = sizes[-1]
        dispatcher = CudagraphDispatcher(vllm_config)
        dispatcher.compilation_config = compilation
        # vLLM's dispatcher pads by the query length it read from the config (1+K) at
        # construction, not by the one initialize_cudagraph_keys is given.
        dispatcher.uniform_decode_query_len = q
        dispatcher.initialize_cudagraph_keys(mode, q)
        # Only the uniform full decode graphs are new; mixed batches stay with vLLM's keys.
        dispatcher.cudagraph_keys[CUDAGraphMode.PIECEWISE].clear()
        dispatcher.cudagraph_keys[CUDAGraphMode.FULL] = {
            d for d in dispatcher.cudagraph_keys[CUDAGraphMode.FULL] if d.uniform}
        dispatchers[q] = dispatcher
    return dispatchers


class QueryLengthDispatcher(CudagraphDispatcher):
    """vLLM's dispatcher for the runner's own keys, listing the extra query lengths' keys too
    when the runner asks what to capture (and vLLM's graph-memory estimate what to count)."""

    def __init__(self, vllm_config):
        super().__init__(vllm_config)
        self.extra: dict[int, CudagraphDispatcher] = {}

    def get_capture_descs(self):
        # One entry per mode, as vLLM's own: its graph-memory estimate
        # (profile_cudagraph_memory) keeps a dict keyed by mode, so a second FULL entry would
        # overwrite the first one's per-graph estimate (seen on the H100: 0.33 GiB estimated,
        # 0.64 GiB captured). Largest first, as vLLM sorts, for the pool's reuse.
        by_mode = {mode: list(descs) for mode, descs in super().get_capture_descs()}
        for q in sorted(self.extra):
            for mode, descs in self.extra[q].get_capture_descs():
                by_mode.setdefault(mode, []).extend(descs)
        order = [CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL]
        return [(mode, sorted(by_mode[mode], key=lambda d: (d.num_tokens, d.num_active_loras),
                              reverse=True))
                for mode in sorted(by_mode, key=order.index) if by_mode[mode]]


class AdaptiveGraphsMixin:
    """Mixed into the model runner (a vLLM ``GPUModelRunner``)."""

    _q_dispatchers: dict[int, CudagraphDispatcher] = {}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Before any key exists (vLLM initialises keys once attention backends are known).
        self.cudagraph_dispatcher = QueryLengthDispatcher(self.vllm_config)

    # ---- setup: after vLLM resolved the graph mode and its own keys ----
    def _check_and_update_cudagraph_mode(self, attention_backends, kv_cache_groups,
                                         is_profiling: bool = False) -> None:
        super()._check_and_update_cudagraph_mode(attention_backends, kv_cache_groups,
                                                 is_profiling)
        self._q_dispatchers = {}
        self.cudagraph_dispatcher.extra = {}
        mode = self.compilation_config.cudagraph_mode
        k = self.num_spec_tokens if self.speculative_config else 0
        if (k < 1 or not adaptive_enabled(self.vllm_config)
                or mode.decode_mode() != CUDAGraphMode.FULL or not mode.separate_routine()):
            return
        self._q_dispatchers = query_len_dispatchers(self.vllm_config, mode, k, self.max_num_tokens)
        extra = self._q_dispatchers
        self.cudagraph_dispatcher.extra = extra
        logger.info("specdec_plugin: full decode graphs for query lengths 1..%d (%s graphs "
                    "besides vLLM's %d-token ones)", k + 1,
                    sum(len(d.cudagraph_keys[CUDAGraphMode.FULL]) for d in extra.values()), k + 1)

    @contextlib.contextmanager
    def adaptive_graph_context(self, query_len: int):
        dispatcher = self._q_dispatchers.get(query_len)
        if dispatcher is None:
            yield
            return
        saved = self.cudagraph_dispatcher, self.uniform_decode_query_len
        self.cudagraph_dispatcher, self.uniform_decode_query_len = dispatcher, query_len
        try:
            yield
        finally:
            self.cudagraph_dispatcher, self.uniform_decode_query_len = saved

    def _query_len_of(self, desc) -> int | None:
        if not self._q_dispatchers or not desc.uniform or not desc.num_reqs:
            return None
        q = desc.num_tokens // desc.num_reqs
        dispatcher = self._q_dispatchers.get(q)
        if dispatcher is not None and desc in dispatcher.cudagraph_keys[CUDAGraphMode.FULL]:
            return q
        return None

    # ---- capture ----
    def _warmup_and_capture(self, desc, cudagraph_runtime_mode, *args, **kwargs):
        q = self._query_len_of(desc)
        if q is None:
            return super()._warmup_and_capture(desc, cudagraph_runtime_mode, *args, **kwargs)
        with self.adaptive_graph_context(q):
            return super()._warmup_and_capture(desc, cudagraph_runtime_mode, *args, **kwargs)

    # ---- each step ----
    def _determine_batch_execution_and_padding(self, num_tokens, num_reqs,
                                               num_scheduled_tokens_np,
                                               max_num_scheduled_tokens, use_cascade_attn,
                                               *args, **kwargs):
        q = max_num_scheduled_tokens
        if (q in self._q_dispatchers and kwargs.get("force_uniform_decode") is None
                and num_tokens == q * num_reqs):
            with self.adaptive_graph_context(q):
                return super()._determine_batch_execution_and_padding(
                    num_tokens, num_reqs, num_scheduled_tokens_np, max_num_scheduled_tokens,
                    use_cascade_attn, *args, **kwargs)
        return super()._determine_batch_execution_and_padding(
            num_tokens, num_reqs, num_scheduled_tokens_np, max_num_scheduled_tokens,
            use_cascade_attn, *args, **kwargs)
