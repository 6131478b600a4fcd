"""The drafter's whole ``propose`` (first pass and the K-1 further steps) replayed as one graph.

Why: vLLM's V1 runner gives its drafters piecewise graphs only
(``SpecDecodeBaseProposer.initialize_cudagraph_keys``). Every drafter layer's KV write and
attention, the metadata updates and the sampling between steps are then launched one by one
from the host, and at small batch that host time is most of the drafter's cost. vLLM's V2
runner records its EAGLE drafter in full graphs, but we stay on the V1 runner, which hosts our
proposers and rejection sampler. So we record the same work here, around vLLM's own
``propose``.

How: what ``propose`` launches on the device depends only on a few host values: K, the number
of target tokens and of requests, the longest query, and which optional inputs are given. Those
values, plus the shapes and dtypes of the inputs, are the graph key. The first call with a new
key does three things:
1. copies its inputs into static buffers;
2. runs vLLM's ``propose`` on them once, on a side stream, as a warm-up in which every kernel
   compiles;
3. records ``propose`` into a graph.
Later calls with that key copy their inputs into the same buffers and replay the graph. The
recorded work reads no device value on the host. Our attention kernels read sequence lengths
from the device (``ops/paged_attention``), so one graph serves any context length.

vLLM's ``propose`` runs unchanged, not recorded, in these cases:
- probabilistic draft sampling (random state);
- multimodal inputs, M-RoPE / XD-RoPE positions;
- parallel drafting, heterogeneous vocabularies;
- data parallelism, expert load balancing;
- queries longer than 1+K (prefills);
- devices without graphs, ``enforce_eager``, ``SPECDEC_DRAFTER_GRAPHS=0``.

EAGLE, EAGLE-3, MTP and draft-model decode steps are padded to a few fixed shapes instead
(drafter_padding.py), and those graphs are all recorded at engine start
(``prerecord_graphs``, called by the runner once the target's graphs are captured); the
exact-shape keys above remain for steps that cannot be padded.

Steps that draft nothing may skip the pass altogether (deferred_sync.py, ``_defer_step``):
their inputs are kept and written in one pass when the request next needs its drafter (with
graphs, at most 1+K tokens per request, so that pass replays the padded k = 0 graph).

Memory: graphs are recorded after vLLM sized the KV cache, so the worker holds back a
reservation for them before it does (``reserve_graph_memory``, graph_memory.py), and a
recording that would go past it is refused: that shape drafts eagerly, with one warning.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from vllm.config import CUDAGraphMode
from specdec_plugin.log import init_logger

from specdec_plugin import envs, step_log
from specdec_plugin.adaptive.config import adaptive_enabled
from specdec_plugin.spec_decode.draft_vocab import greedy_draft_tokens, local_argmax_applies
from specdec_plugin.spec_decode.deferred_sync import (
    host_seq_lens,
    inserts_next_token_slot,
    make_deferred_sync,
)
from specdec_plugin.spec_decode.drafter_kv_writer import make_kv_writer
from specdec_plugin.spec_decode.drafter_padding import PaddedDraftInputs
from specdec_plugin.spec_decode.graph_memory import (
    GraphMemoryBudget,
    largest_decode_shape,
    logits_bytes,
    static_input_bytes,
    tensor_bytes,
)

logger = init_logger(__name__)

# Graphs share one memory pool (they replay one after another), so each extra graph costs
# little memory. The cap bounds recording stalls when a server sees many batch shapes.
MAX_GRAPHS = 128


class _DraftGraph(NamedTuple):
    graph: Any
    static: list[torch.Tensor]  # the non-None inputs, in ``_ProposeCall.tensors`` order
    draft_token_ids: torch.Tensor  # [batch, K], written by every replay


@dataclass
class _ProposeCall:
    """The arguments of one ``propose`` call, split into device tensors and the rest."""

    kwargs: dict[str, Any]

    def tensors(self) -> list[torch.Tensor | None]:
        kw, cad = self.kwargs, self.kwargs["common_attn_metadata"]
        return [kw["target_token_ids"], kw["target_positions"], kw["target_hidden_states"],
                kw["next_token_ids"], kw["token_indices_to_sample"], kw["num_rejected_tokens_gpu"],
                cad.query_start_loc, cad.seq_lens, cad.block_table_tensor, cad.slot_mapping]

    def on(self, static: list[torch.Tensor | None], max_model_len: int) -> dict[str, Any]:
        """The same call reading ``static`` instead of the live tensors.

        ``propose`` changes its metadata in place (sequence lengths, host shadows), so each
        use gets a fresh copy. ``max_seq_len`` becomes the model's limit: it only sizes kernel
        launches, and a recorded launch must suit every later length.

        The attention metadata of these steps still comes from ``build_for_drafting``, so our
        attention plans them as host-bound (split the KV only past 2k keys), a hint meant for
        eager launches. Results are exact either way; whether graphs would gain from the
        graph-time plan (more splits at small batch and long context) is not measured yet.
        """
        (token_ids, positions, hidden, next_ids, to_sample, rejected,
         query_start_loc, seq_lens, block_table, slot_mapping) = static
        cad = self.kwargs["common_attn_metadata"]

        def host_copy(t):
            return None if t is None else t.clone()

        static_cad = cad.replace(
            query_start_loc=query_start_loc, seq_lens=seq_lens, block_table_tensor=block_table,
            slot_mapping=slot_mapping, max_seq_len=max_model_len,
            query_start_loc_cpu=host_copy(cad.query_start_loc_cpu),
            _seq_lens_cpu=host_copy(cad._seq_lens_cpu),
            _num_computed_tokens_cpu=host_copy(cad._num_computed_tokens_cpu),
            seq_lens_cpu_upper_bound=host_copy(cad.seq_lens_cpu_upper_bound),
            # Device fields propose and our builders never read: no stale pointers recorded.
            positions=None, is_prefilling=None,
        )
        return self.kwargs | {
            "target_token_ids": token_ids, "target_positions": positions,
            "target_hidden_states": hidden, "next_token_ids": next_ids,
            "token_indices_to_sample": to_sample, "num_rejected_tokens_gpu": rejected,
            "common_attn_metadata": static_cad,
        }


def _copy_into(static: list[torch.Tensor], live: list[torch.Tensor]) -> None:
    # One multi-tensor launch per dtype instead of one copy per input: this is host time on
    # every drafter step.
    torch._foreach_copy_(static, live)


class DrafterGraphs:
    """Mixin for vLLM's V1 drafters (``SpecDecodeBaseProposer`` subclasses): replays ``propose``
    from graphs where it can (see the module doc), and takes greedy drafts over a draft vocabulary
    without widening it (draft_vocab.py). Put it before vLLM's class in the bases."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The device layer comes down from the runner that builds us (runner_drafters.py), not
        # from the global platform: data flows config -> platform -> worker -> runner -> here.
        layer = getattr(kwargs.get("runner"), "device_layer", None)
        self._graph_device = self._device_for_graphs(layer)
        self._draft_graphs: dict[tuple, _DraftGraph | None] = {}  # None: recording failed
        self._graph_pool = None
        self._graph_stream = None
        self._recording_graph = False
        self._warned_graph_cap = False
        # Set by the worker before the KV cache is sized (reserve_graph_memory); None: no
        # reservation was made (no graphs here, or the user fixed the KV cache size).
        self._graph_budget: GraphMemoryBudget | None = None
        self._warned_graph_budget = False
        # Built at the first padded recording (the block size is known only by then); False:
        # this drafter's steps are never padded.
        self._padded_inputs: PaddedDraftInputs | None | bool = None
        self._prerecording = False
        self._padded_buffers_charged = False
        # Set at load_model: greedy drafts argmax over the draft vocabulary (draft_vocab.py).
        self._local_draft_argmax = False
        # Steps that draft nothing keep their pass for later (deferred_sync.py). Built here, so
        # its buffers exist before vLLM measures memory and sizes the KV cache.
        self._sync_runner = kwargs.get("runner")
        self._deferred_sync = make_deferred_sync(self, self._sync_runner)
        self._recent_k = (0, 0)  # the draft lengths of the last two calls, newest last
        self._last_path = "eager"  # how the last pass ran, for SPECDEC_STEP_LOG

    def _device_for_graphs(self, device):
        config = self.vllm_config
        if (device is None or not device.supports_graphs or not envs.drafter_graphs()
                or config.model_config.enforce_eager or self.speculative_config.enforce_eager
                or config.compilation_config.cudagraph_mode == CUDAGraphMode.NONE
                or config.parallel_config.data_parallel_size > 1):
            return None
        return device

    # ---- memory (graph_memory.py says why) ----
    def reserve_graph_memory(self, measure_peak) -> int:
        """Bytes to hold back from the KV cache for our graphs; 0 where none are recorded.

        ``measure_peak(fn)`` runs ``fn`` and returns the peak device memory it allocated. The
        working set is the drafter's own forward passes at the largest decode shape (vLLM's
        ``dummy_run``: K passes, no attention metadata, so no KV cache is needed yet) plus
        the logits of one step. From then on recordings are charged against the result.
        """
        if self._graph_device is None:
            return 0
        config = self.vllm_config
        shape = largest_decode_shape(self.max_batch_size, self.max_num_tokens,
                                     self.speculative_config.num_speculative_tokens)
        forward = measure_peak(lambda: self.dummy_run(shape.num_tokens, use_cudagraphs=False))
        working_set = forward + logits_bytes(shape.num_reqs,
                                             self.draft_model_config.get_vocab_size())
        block_size = config.cache_config.block_size or 16
        max_blocks = -(-self.max_model_len // block_size)
        # The drafter's own hidden buffer may be the wider one (the budget covers either).
        width = max(self._target_hidden_width(), self.hidden_size)
        static = static_input_bytes(shape, width, self.dtype, max_blocks)
        self._graph_budget = GraphMemoryBudget.for_largest_shape(working_set, static)
        limit = self._graph_budget.limit
        logger.info("specdec_plugin: %.0f MiB held back from the KV cache for drafter graphs "
                    "(largest step %d requests / %d tokens: working set %.0f MiB, inputs "
                    "%.1f MiB)", limit / 2**20, shape.num_reqs, shape.num_tokens,
                    working_set / 2**20, static / 2**20)
        return limit

    def _target_hidden_width(self) -> int:
        """Width of ``target_hidden_states`` as the runner passes it: EAGLE-3 gets the target's
        auxiliary layers side by side (three unless its config names others)."""
        target = self.vllm_config.model_config.get_hidden_size()
        if self.method == "eagle3" and getattr(self, "eagle3_use_aux_hidden_state", True):
            layers = getattr(self.draft_model_config.hf_config,
                             "eagle_aux_hidden_state_layer_ids", None) or (0, 1, 2)
            return len(layers) * target
        return target

    @staticmethod
    def _reserved_bytes() -> int:
        """What the caching allocator holds on the current device (graph pools included)."""
        return int(torch.accelerator.memory_stats().get("reserved_bytes.all.current", 0))

    def _budget_allows(self, key: tuple, static_bytes: int) -> bool:
        budget = self._graph_budget
        if budget is None or budget.allows(static_bytes):
            return True
        if not self._warned_graph_budget:
            self._warned_graph_budget = True
            logger.warning("specdec_plugin: drafter graphs used %.0f of the %.0f MiB held back "
                           "for them; further batch shapes draft eagerly (first: key %s)",
                           budget.used / 2**20, budget.limit / 2**20, key[:3])
        return False

    # ---- vLLM's hooks ----
    def load_model(self, target_model) -> None:
        super().load_model(target_model)
        sync = self._deferred_sync
        if sync is not None and sync.wants_kv_writer:  # deferred_sync.py: KV-only flushes
            sync.attach_kv_writer(make_kv_writer(self.model))
        # Decided once here, where reading the draft map from the device is allowed (inside a
        # graph recording it would not be).
        self._local_draft_argmax = self._drafts_argmax_locally()
        if self._local_draft_argmax:
            logger.info("specdec_plugin: greedy drafts take the argmax over the drafter's "
                        "%d-token vocabulary (not widened to the target's)",
                        self.model.draft_id_to_target_id.numel())

    def _drafts_argmax_locally(self) -> bool:
        # vLLM's own options for the same sampling step win.
        return (not self.use_local_argmax_reduction
                and not getattr(self, "use_heterogeneous_vocab", False)
                and local_argmax_applies(self.model))

    def _greedy_sample(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # Greedy drafting only: vLLM calls this where the draft is not sampled; sampled drafts
        # keep vLLM's compute_logits (they need the probabilities over the target vocabulary).
        if self._local_draft_argmax:
            return greedy_draft_tokens(self.model, hidden_states)
        return super()._greedy_sample(hidden_states)

    def _determine_batch_execution_and_padding(self, num_tokens: int,
                                               use_cudagraphs: bool = True):
        if self._recording_graph:
            # Inside our graph vLLM's piecewise graphs must not replay, and nothing is padded.
            return CUDAGraphMode.NONE, num_tokens, None
        return super()._determine_batch_execution_and_padding(num_tokens, use_cudagraphs)

    def propose(self, num_speculative_tokens, target_token_ids, target_positions,
                target_hidden_states, next_token_ids, token_indices_to_sample,
                common_attn_metadata, sampling_metadata, mm_embed_inputs=None,
                num_rejected_tokens_gpu=None, slot_mappings=None) -> torch.Tensor:
        kwargs = dict(
            num_speculative_tokens=num_speculative_tokens, target_token_ids=target_token_ids,
            target_positions=target_positions, target_hidden_states=target_hidden_states,
            next_token_ids=next_token_ids, token_indices_to_sample=token_indices_to_sample,
            common_attn_metadata=common_attn_metadata, sampling_metadata=sampling_metadata,
            mm_embed_inputs=mm_embed_inputs, num_rejected_tokens_gpu=num_rejected_tokens_gpu,
            slot_mappings=slot_mappings)
        start = time.perf_counter()
        if self._defer_step(kwargs):
            self.num_speculative_tokens = 0
            self._last_draft_probs = None
            self._log_step("deferred", kwargs, start)
            return torch.empty(common_attn_metadata.batch_size(), 0, dtype=torch.int64,
                               device=target_token_ids.device)
        drafts = self._propose_now(kwargs)
        self._log_step(self._last_path, kwargs, start)
        return drafts

    def _log_step(self, path: str, kwargs: dict, start: float) -> None:
        if step_log.enabled():  # SPECDEC_STEP_LOG: how this step's drafter ran
            step_log.record("draft", path=path, k=kwargs["num_speculative_tokens"],
                            tokens=kwargs["common_attn_metadata"].num_actual_tokens,
                            ms=round((time.perf_counter() - start) * 1e3, 3))

    def _propose_now(self, kwargs: dict) -> torch.Tensor:
        """vLLM's ``propose``, replayed from a graph where one fits (deferred flushes too)."""
        call = _ProposeCall(kwargs)
        self._last_path = "replay_padded"
        if self._recordable(call):
            drafts = self._replay_padded(call)
            if drafts is not None:
                return drafts
        key = self._graph_key(call)
        entry = None
        if key is not None:
            entry = self._draft_graphs[key] if key in self._draft_graphs else self._record(key, call)
        if entry is None:
            self._last_path = "eager"
            return super().propose(**call.kwargs)
        self._last_path = "replay"
        _copy_into(entry.static, [t for t in call.tensors() if t is not None])
        entry.graph.replay()
        # What propose leaves on the host for the runner.
        self.num_speculative_tokens = kwargs["num_speculative_tokens"]
        self._last_draft_probs = None
        # The next replay overwrites the graph's output; the runner may still hold this one.
        return entry.draft_token_ids.clone()

    # ---- deferred KV sync (deferred_sync.py) ----
    def _defer_step(self, kwargs: dict) -> bool:
        """True: this step's pass is deferred. Else any passes deferred for the step's requests
        have run, and the step's own pass runs next."""
        sync = self._deferred_sync
        k = kwargs["num_speculative_tokens"]
        # Under async scheduling the host's sequence lengths count the drafts still being
        # verified as accepted: those of the last two steps at most.
        slack = max(self._recent_k) if getattr(self._sync_runner, "use_async_spec_decode",
                                               False) else 0
        self._recent_k = (self._recent_k[1], k)
        if sync is None:
            return False
        if self.eplb_state is not None or self._share_mtp_indices:  # set after construction
            sync.forget_all()
            self._deferred_sync = None
            return False
        sync.block_size = self.block_size
        cad = kwargs["common_attn_metadata"]
        req_ids = self._sync_runner.input_batch.req_ids
        # A flush is decode-shaped when the depth is at most 1+K: it then replays the padded
        # k = 0 graph like any plain step (make_deferred_sync sizes it so on graph devices).
        return sync.step(k, req_ids, kwargs, host_seq_lens(self._sync_runner, cad), slack,
                         lambda **flush: self._propose_now(flush))

    def forget_deferred(self, req_ids) -> None:
        """The runner's word that these requests finished or were preempted."""
        if self._deferred_sync is not None:
            self._deferred_sync.forget(req_ids)

    def drop_all_deferred(self) -> None:
        """The runner skips the drafter this step: the kept tokens can no longer line up."""
        if self._deferred_sync is not None:
            self._deferred_sync.forget_all()

    # ---- padded graphs (drafter_padding.py) ----
    def _padding(self) -> PaddedDraftInputs | None:
        if self._padded_inputs is None:
            self._padded_inputs = self._make_padded_inputs() or False
        return self._padded_inputs or None

    def _make_padded_inputs(self) -> PaddedDraftInputs | None:
        next_token_slot = inserts_next_token_slot(self)
        if (self._graph_device is None or not envs.drafter_padding()
                or (self.needs_extra_input_slots and not next_token_slot)
                or self.block_size <= 0):
            return None
        from specdec_plugin.ops.registry import get_kernel

        query_len = 1 + self.speculative_config.num_speculative_tokens
        # The padded pass must fit the drafter's token buffers, inserted slots included.
        max_reqs = min(self.max_batch_size,
                       self.max_num_tokens // (query_len + int(next_token_slot)))
        if max_reqs < 1:
            return None
        return PaddedDraftInputs(
            max_reqs, query_len, self._target_hidden_width(), self.dtype,
            -(-self.max_model_len // self.block_size),
            self.max_model_len, self.device,
            get_kernel("pad_drafter_batch", self._graph_device.kernel_providers),
            next_token_slot=next_token_slot)

    def _replay_padded(self, call: _ProposeCall) -> torch.Tensor | None:
        inputs = self._padding()
        if inputs is None or not inputs.fits(call.kwargs):
            return None
        k = call.kwargs["num_speculative_tokens"]
        num_reqs = call.kwargs["common_attn_metadata"].batch_size()
        padded = inputs.bucket(num_reqs)
        key = ("padded", k, padded)
        entry = self._draft_graphs.get(key, False)
        if entry is False:  # not recorded at start (off, or the cap): record it now
            entry = self._record_padded(inputs, k, padded)
        if entry is None:
            return None
        inputs.fill(call.kwargs, padded)
        entry.graph.replay()
        self.num_speculative_tokens = k
        self._last_draft_probs = None
        return entry.draft_token_ids[:num_reqs].clone()

    def _record_padded(self, inputs: PaddedDraftInputs, k: int, padded: int) -> _DraftGraph | None:
        # The padded graphs share one buffer set, made before any of them: it is charged once,
        # here, whether or not this recording is then allowed (the memory is held either way).
        if not self._padded_buffers_charged and self._graph_budget is not None:
            self._graph_budget.charge_buffers(inputs.nbytes())
            self._padded_buffers_charged = True
        inputs.fill(None, padded)  # fillers only: nothing is written to the KV cache
        vllm_propose = super().propose
        return self._capture(("padded", k, padded),
                             lambda: vllm_propose(**inputs.propose_kwargs(padded, k)),
                             0, [], padded, padded * inputs.query_len)

    def draft_lengths_to_record(self) -> list[int]:
        """The draft lengths a step may ask for: every one up to K where the adaptive
        controller chooses them (0 included: a plain step still runs the drafter's pass that
        keeps the drafter's KV cache in sync where it cannot defer it, deferred_sync.py:
        verification steps, prefills, a KV block filling), else K alone."""
        k = self.speculative_config.num_speculative_tokens
        return list(range(k + 1)) if adaptive_enabled(self.vllm_config) else [k]

    def prerecord_graphs(self) -> None:
        """Record every padded graph now, largest batch first, so no live step records one."""
        inputs = self._padding()
        if inputs is None:
            return
        start, count = time.perf_counter(), 0
        inputs.compile_kernel_variants()
        self._prerecording = True
        try:
            for padded in reversed(inputs.buckets):
                for k in self.draft_lengths_to_record():
                    if ("padded", k, padded) not in self._draft_graphs:
                        count += self._record_padded(inputs, k, padded) is not None
        finally:
            self._prerecording = False
        logger.info("specdec_plugin: %d drafter graphs recorded at start-up (draft lengths %s, "
                    "batches padded to %s requests) in %.1f s", count,
                    self.draft_lengths_to_record(), inputs.buckets, time.perf_counter() - start)

    def padded_draft_timer(self):
        """For the start-up cost table (adaptive/measure.py): ``(run, buckets)``, where
        ``run(padded, k)`` fills the padded inputs with fillers (nothing reaches the KV cache)
        and replays the graph that a step drafting k tokens for up to ``padded`` requests
        replays; None where drafting is not padded."""
        inputs = self._padding()
        if inputs is None:
            return None

        def run(padded: int, k: int) -> None:
            entry = self._draft_graphs.get(("padded", k, padded))
            if not entry:
                raise LookupError(f"no padded drafter graph for {k} drafts at {padded} requests")
            # The buffers were made under inference mode (prerecord_graphs), and the table is
            # timed outside it: writing them there would raise.
            with torch.inference_mode():
                inputs.fill(None, padded)
                entry.graph.replay()
        return run, list(inputs.buckets)

    # ---- graphs ----
    def _recordable(self, call: _ProposeCall) -> bool:
        """Whether vLLM's ``propose`` may be recorded for this call (module doc)."""
        kw = call.kwargs
        k, cad = kw["num_speculative_tokens"], kw["common_attn_metadata"]
        # k == 0 is recorded too: plain steps whose pass is not deferred (deferred_sync.py)
        # still run the drafter's pass over the new tokens, which keeps its KV cache in sync.
        return not (self._graph_device is None or k < 0 or kw["mm_embed_inputs"] is not None
                or self.parallel_drafting or self.uses_mrope or self.uses_xdrope_dim > 0
                or getattr(self, "use_heterogeneous_vocab", False)
                or self.eplb_state is not None or self._share_mtp_indices
                or (self._enable_probabilistic_draft_probs
                    and not kw["sampling_metadata"].all_greedy)
                or kw["target_positions"].dim() != 1
                # Decode-sized queries only (prefills draft eagerly). The bound is the configured
                # K: with adaptive drafting the verified step may have drafted more than this one.
                or cad.max_query_len > 1 + self.speculative_config.num_speculative_tokens
                or cad.causal is not True
                or cad.dcp_local_seq_lens is not None or cad.encoder_seq_lens is not None
                or cad.rswa_prefix_lens is not None or cad.logits_indices_padded is not None)

    def _graph_key(self, call: _ProposeCall) -> tuple | None:
        if not self._recordable(call):
            return None
        kw = call.kwargs
        k, cad = kw["num_speculative_tokens"], kw["common_attn_metadata"]
        shapes = tuple(None if t is None else (tuple(t.shape), t.dtype) for t in call.tensors())
        return (k, cad.max_query_len, cad.num_actual_tokens, shapes)

    def _record(self, key: tuple, call: _ProposeCall) -> _DraftGraph | None:
        live = call.tensors()
        static = [None if t is None else torch.empty_like(t) for t in live]
        present = [t for t in static if t is not None]
        _copy_into(present, [t for t in live if t is not None])
        vllm_propose = super().propose
        return self._capture(key, lambda: vllm_propose(**call.on(static, self.max_model_len)),
                             tensor_bytes(live), present,
                             call.kwargs["common_attn_metadata"].batch_size(), key[2])

    def _capture(self, key: tuple, run, static_bytes: int, static: list[torch.Tensor],
                 num_reqs: int, num_tokens: int) -> _DraftGraph | None:
        """Record ``run`` (vLLM's propose on inputs already in place) under ``key``: a warm-up
        on the side stream, in which every kernel compiles, then the recording. None, and
        that key drafts eagerly from then on, where the cap, the memory budget or the
        recording itself refuses."""
        if len(self._draft_graphs) >= MAX_GRAPHS:
            if not self._warned_graph_cap:
                self._warned_graph_cap = True
                logger.warning("specdec_plugin: %d drafter graphs recorded; further batch shapes "
                               "draft eagerly", MAX_GRAPHS)
            return None
        if not self._budget_allows(key, static_bytes):
            self._draft_graphs[key] = None  # drafts eagerly from now on, like a failed one
            return None
        reserved_before = self._reserved_bytes() if self._graph_budget is not None else 0
        device = self._graph_device
        if self._graph_pool is None:
            self._graph_pool, self._graph_stream = device.new_graph_pool(), device.new_stream()
        start = time.perf_counter()
        self._recording_graph = True
        try:
            device.run_on_stream(run, self._graph_stream)
            graph, draft_token_ids = device.capture_graph(run, self._graph_pool,
                                                          self._graph_stream)
        except Exception as err:  # e.g. an op that cannot be recorded: draft eagerly instead
            # A padded size's steps fall back to exact-shape graphs (_propose_now), which
            # draft eagerly in turn where they fail too.
            fallback = ("these steps use exact-shape graphs or draft eagerly"
                        if key[0] == "padded" else "these steps draft eagerly")
            logger.warning("specdec_plugin: drafter graph for key %s not recorded (%s: %s); %s",
                           key[:3], type(err).__name__, err, fallback)
            self._draft_graphs[key] = None
            # The failed graph dies here and, if it was the pool's only graph, takes the pool
            # with it: torch's allocator then refuses the pool id for any later capture
            # ("use_count > 0" assert; seen on the H100, 2026-11-25: after one forced failure
            # no shape was recorded again). Later recordings start a pool of their own.
            self._graph_pool = None
            return None
        finally:
            self._recording_graph = False
            if self._graph_budget is not None:  # a failed recording may have grown the pool
                grown = self._reserved_bytes() - reserved_before + static_bytes  # buffers made before
                self._graph_budget.charge(grown, static_bytes)
        entry = _DraftGraph(graph, static, draft_token_ids)
        self._draft_graphs[key] = entry
        # At INFO only while serving, where a recording stalls a step; prerecord_graphs sums
        # up the start-up ones.
        logger.log(logging.DEBUG if self._prerecording else logging.INFO,
                   "specdec_plugin: drafter graph recorded: key %s, %d requests, %d tokens "
                   "(%.0f ms)", key[:3], num_reqs, num_tokens, (time.perf_counter() - start) * 1e3)
        return entry
