"""Deferred drafter KV sync: a step that drafts nothing runs no drafter pass.

Why: vLLM's EAGLE-family and draft-model ``propose`` runs the drafter's first pass over the
step's new tokens even when the step drafts nothing (``num_speculative_tokens == 0``), so that
the drafter's KV cache holds every position when drafting resumes. When drafts keep missing,
the adaptive controller drafts nothing almost every step, and that pass, which reads all of
the drafter's weights for one token per request, was most of what speculation still cost
(H100, EAGLE-3, every draft rejected: 1.03-1.09x of plain decoding, BENCHMARKS.md).

How: on a step that drafts nothing and whose requests all have one new token, the inputs the
pass would have read are kept per request instead (target token id, position, target hidden
states, the drafter KV slot of that position). Before a request next needs its drafter, one
pass over all of its kept tokens writes their drafter KV, exactly as the skipped passes would
have: the pass over steps t..t+n-1 takes each kept token's successor as its input id (the
successor of the token kept at step i is the first target token of step i+1, and that of the
last is the first target token of the current step), at the kept positions and slots, with
the kept hidden states. Rows are computed independently by our kernels, so the KV written is
the same as the per-step passes would have written (tests/test_deferred_sync_engine.py checks
the drafts against deferral off).

A request's kept tokens are written (a "flush", one pass for all requests of the batch that
have any, ahead of the step's own pass) when:
- the step drafts (k > 0), or a request in it has more than one new token (a prefill, or a
  verification of drafts, whose rejected tokens vLLM handles in its own pass);
- a request has ``depth`` tokens kept (the buffers are bounded);
- with prefix caching under a scheduler other than our adaptive one, the step's token
  completes a KV block (or may, under async scheduling, where the host knows positions only
  up to the drafts in flight): a full block can be reused by another request, which must find
  the drafter's KV in it. Our adaptive scheduler instead keeps the blocks of a finished or
  preempted request's last positions out of the prefix cache (``uncache_window``, below):
  flushing before every block fills would, at batch 16 and more, flush almost every step;
- the step's layout is not one this module maps (batch rows that are not the runner's
  requests).
A request that finishes or is preempted loses its kept tokens (its blocks are freed, and
those that may hold them are not left in the prefix cache, see above), and so do all requests
when the runner skips the drafter for a step (its input does not fit the drafter: vLLM then
leaves the drafter's KV behind too). Kept tokens that are lost only leave drafter KV stale:
drafts may be worse, the output is the target's either way.

The flush pass runs ``propose`` with k = 0 on the kept tokens alone (a query of up to
``depth`` tokens per request; on graph devices ``depth`` is 1+K, so the flush replays the
padded k = 0 graph recorded at start, elsewhere it runs eagerly); the step's own pass then
runs as before. At a
step that drafts after deferral that is two drafter passes where vLLM runs one, against the
n skipped ones. Merging the kept tokens into the step's own pass would save one more.
Single-layer EAGLE-family drafters instead write only their KV (drafter_kv_writer.py: the
layer's attention input, qkv, rotary and the cache write, about ten launches run eagerly,
with none of the pass's attention, MLP or graph bookkeeping), so their depth is
``KV_ONLY_DEPTH`` on every device.

Device-agnostic torch; the host builds the gather indices from what it already knows (which
requests are in the step, how many tokens each kept), so nothing is read back from the device.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
from vllm.v1.attention.backend import CommonAttentionMetadata

from specdec_plugin import step_log
from specdec_plugin.log import init_logger

logger = init_logger(__name__)

# Steps a request may defer before a forced flush. Each flush is one drafter pass over
# ``depth`` tokens per request instead of ``depth`` passes over one; past a few, the saving
# grows little (1/depth of a pass per step) while the buffers grow linearly.
DEFAULT_DEPTH = 8
# With KV-only flushes (drafter_kv_writer.py) a flush is a few eager launches whatever its
# length, so it may come less often; the buffers stay within KV_ONLY_BUFFER_BYTES.
KV_ONLY_DEPTH = 16
KV_ONLY_BUFFER_BYTES = 256 * 2**20


class DeferredDrafterSync:
    """Per-request buffers of skipped drafter-pass inputs, keyed by request id."""

    def __init__(self, max_reqs: int, depth: int, hidden_width: int, hidden_dtype: torch.dtype,
                 device: torch.device, block_size: int, flush_before_block_fills: bool) -> None:
        self.max_reqs, self.depth = max_reqs, depth
        self.hidden_width, self.hidden_dtype = hidden_width, hidden_dtype
        self.block_size, self.flush_before_block_fills = block_size, flush_before_block_fills
        self.device = torch.device(device)
        slots = max_reqs * depth
        # dtypes as vLLM's runner passes them: input ids int32, positions and slots int64.
        self.token_ids = torch.zeros(slots, dtype=torch.int32, device=device)
        self.positions = torch.zeros(slots, dtype=torch.int64, device=device)
        self.slot_mapping = torch.zeros(slots, dtype=torch.int64, device=device)
        self.hidden = torch.zeros(slots, hidden_width, dtype=hidden_dtype, device=device)
        self._row: dict[str, int] = {}  # request id -> buffer row
        self._free = list(range(max_reqs - 1, -1, -1))
        self._count = np.zeros(max_reqs, dtype=np.int64)  # tokens kept per buffer row
        self._rows_key: tuple | None = None  # the batch whose buffer rows are ``_rows``
        self._rows = np.zeros(0, dtype=np.int64)
        # KV-only flushes (attach_kv_writer); ``full_flush_depth``: the depth a full pass fits.
        self.kv_writer: Callable[..., None] | None = None
        self.wants_kv_writer = False
        self.full_flush_depth = depth
        # Read by tests and benchmarks.
        self.deferred_steps = 0
        self.flushes = 0
        self.dropped_tokens = 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size()
                   for t in (self.token_ids, self.positions, self.slot_mapping, self.hidden))

    def attach_kv_writer(self, writer: Callable[..., None] | None) -> None:
        """At drafter load, before any step: the KV-only writer, or None (the drafter could
        not get one after all), which brings the depth back to what a full pass fits."""
        self.kv_writer = writer
        if writer is None:
            self.depth = min(self.depth, self.full_flush_depth)

    # ---- request lifetime ----
    def pending(self, req_id: str) -> int:
        row = self._row.get(req_id)
        return 0 if row is None else int(self._count[row])

    def forget(self, req_ids) -> None:
        """Requests that finished or were preempted: their blocks are freed."""
        for req_id in req_ids:
            row = self._row.pop(req_id, None)
            if row is not None:
                self._rows_key = None  # a row is freed: the batch's row map is stale
                self.dropped_tokens += int(self._count[row])
                self._count[row] = 0
                self._free.append(row)

    def forget_all(self) -> None:
        self.forget(list(self._row))

    # ---- the step ----
    def step(self, k: int, req_ids: Sequence[str], kwargs: dict[str, Any],
             host_seq_lens: np.ndarray | None, slack: int,
             run_pass: Callable[..., Any]) -> bool:
        """Called with the arguments of a ``propose`` call. True: the step's pass is deferred
        (the caller returns no drafts). False: any tokens kept for the step's requests were
        written by ``run_pass`` (vLLM's propose) and the caller runs the step's pass.

        ``host_seq_lens``: each row's sequence length as the host knows it, at most ``slack``
        tokens more than the truth (async scheduling); None: unknown.
        """
        cad: CommonAttentionMetadata = kwargs["common_attn_metadata"]
        num_reqs = cad.batch_size()
        if num_reqs != len(req_ids):  # rows we cannot name: keep nothing for anyone
            self.forget_all()
            return False
        rows = self._rows_of(req_ids)  # buffer row per batch row, -1: none yet
        deferrable = (self._deferrable(k, num_reqs, kwargs, host_seq_lens, slack)
                      and int((rows < 0).sum()) <= len(self._free))
        held = rows[rows >= 0]
        if not deferrable or (held.size and int(self._count[held].max()) >= self.depth):
            # Before the step's own pass (it attends to these positions), or to make room.
            self._flush(rows, kwargs, run_pass)
        if deferrable:
            self._keep(req_ids, rows, kwargs)
            return True
        return False

    def _rows_of(self, req_ids: Sequence[str]) -> np.ndarray:
        """Each batch row's buffer row (-1: none). A decoding batch is the same requests in the
        same order step after step: the last answer is kept until the batch or the row map
        changes (on the H200's host at batch 64, under cProfile, the lookup cost about 50 us a
        step when it ran every step)."""
        key = tuple(req_ids)
        if key != self._rows_key:
            self._rows_key = key
            self._rows = np.fromiter((self._row.get(r, -1) for r in key), dtype=np.int64,
                                     count=len(key))
        return self._rows

    def _deferrable(self, k, num_reqs, kwargs, host_seq_lens, slack) -> bool:
        cad = kwargs["common_attn_metadata"]
        if (k != 0 or num_reqs == 0 or cad.max_query_len != 1 or cad.num_actual_tokens != num_reqs
                or kwargs.get("num_rejected_tokens_gpu") is not None
                or kwargs.get("mm_embed_inputs") is not None
                or kwargs["target_positions"].dim() != 1
                or kwargs["target_hidden_states"].shape[-1] != self.hidden_width
                or kwargs["target_hidden_states"].dtype != self.hidden_dtype):
            return False
        if num_reqs > self.max_reqs:
            return False
        if self.flush_before_block_fills:
            if host_seq_lens is None:
                return False
            # The token at position p = seq_len - 1 completes its block when p + 1 is a
            # multiple of the block size; under async scheduling p may be up to ``slack`` less.
            hi = np.asarray(host_seq_lens[:num_reqs], dtype=np.int64)
            lo = hi - slack
            if np.any(hi // self.block_size > (lo - 1) // self.block_size):
                return False
        return True

    def _keep(self, req_ids, rows: np.ndarray, kwargs) -> None:
        cad = kwargs["common_attn_metadata"]
        num_reqs = len(req_ids)
        for i in np.flatnonzero(rows < 0):
            rows[i] = self._row[req_ids[i]] = self._free.pop()
        index = self._to_device(rows * self.depth + self._count[rows])
        self.token_ids.index_copy_(0, index, kwargs["target_token_ids"][:num_reqs])
        self.positions.index_copy_(0, index, kwargs["target_positions"][:num_reqs])
        self.slot_mapping.index_copy_(0, index, cad.slot_mapping[:num_reqs])
        self.hidden.index_copy_(0, index, kwargs["target_hidden_states"][:num_reqs])
        self._count[rows] += 1
        self.deferred_steps += 1

    def _flush(self, rows, kwargs, run_pass) -> None:
        """Writes the drafter KV of the kept tokens of this step's requests: through
        ``kv_writer`` where there is one, else one vLLM ``propose`` (k = 0) over them."""
        counts_all = np.where(rows >= 0, self._count[np.maximum(rows, 0)], 0)
        sel_np = np.flatnonzero(counts_all > 0)  # batch rows with kept tokens
        if not sel_np.size:
            return
        cad: CommonAttentionMetadata = kwargs["common_attn_metadata"]
        buf_rows = rows[sel_np]
        counts = counts_all[sel_np]
        # Kept token j of buffer row r sits at r * depth + j: every row's first ``count``.
        offsets = np.arange(int(counts.max()))
        kept = offsets[None, :] < counts[:, None]
        gather = (buf_rows[:, None] * self.depth + offsets[None, :])[kept]
        # Each flushed row's first target token in the step: the successor of its last kept
        # token.
        first_np = cad.query_start_loc_cpu[:-1].numpy().astype(np.int64)[sel_np]
        if self.kv_writer is not None:
            self._write_kv_only(gather, counts, first_np, kwargs["target_token_ids"])
        else:
            self._run_full_pass(rows, sel_np, counts, gather, first_np, kwargs, run_pass)
        self._count[buf_rows] = 0
        self.flushes += 1
        step_log.record("flush", reqs=int(sel_np.size), tokens=int(gather.size),
                        kv_only=self.kv_writer is not None)

    def _run_full_pass(self, rows, sel_np, counts, gather, first_np, kwargs, run_pass) -> None:
        """vLLM's ``propose`` (k = 0) over the kept tokens (``gather``, in batch-row order)."""
        cad: CommonAttentionMetadata = kwargs["common_attn_metadata"]
        qsl_cpu = cad.query_start_loc_cpu[:len(rows) + 1]
        query_lens_cpu = (qsl_cpu[1:] - qsl_cpu[:-1])
        # One host-to-device copy for every index the pass needs (each is a launch and, from
        # pageable memory, a staging copy on the host): the kept tokens' buffer slots, the
        # batch rows flushed and the first target token of each.
        packed = self._to_device(np.concatenate([gather, sel_np, first_np]))
        gather_d = packed[:gather.size]
        sel = packed[gather.size:gather.size + sel_np.size]
        first = packed[gather.size + sel_np.size:]
        next_token_ids = kwargs["target_token_ids"].index_select(0, first)
        # The kept tokens end where the step's tokens begin.
        qsl = cad.query_start_loc[:len(rows) + 1]
        query_lens = qsl[1:] - qsl[:-1]
        seq_lens = (cad.seq_lens - query_lens.to(cad.seq_lens.dtype)).index_select(0, sel)
        qsl_np = np.zeros(sel_np.size + 1, dtype=np.int32)
        qsl_np[1:] = np.cumsum(counts)
        qsl_flush_cpu = torch.from_numpy(qsl_np)

        def host_minus(t):
            if t is None:
                return None
            return (t[:len(rows)] - query_lens_cpu.to(t.dtype))[torch.from_numpy(sel_np)]

        seq_lens_cpu = host_minus(cad._seq_lens_cpu)
        flush_cad = CommonAttentionMetadata(
            query_start_loc=qsl_flush_cpu.to(self.device, non_blocking=True),
            query_start_loc_cpu=qsl_flush_cpu,
            seq_lens=seq_lens,
            num_reqs=int(sel_np.size),
            num_actual_tokens=int(qsl_np[-1]),
            max_query_len=int(counts.max()),
            max_seq_len=cad.max_seq_len,
            block_table_tensor=cad.block_table_tensor.index_select(0, sel),
            slot_mapping=self.slot_mapping.index_select(0, gather_d),
            causal=True,
            _seq_lens_cpu=seq_lens_cpu,
            _num_computed_tokens_cpu=(None if seq_lens_cpu is None
                                      else seq_lens_cpu - torch.from_numpy(counts).to(seq_lens_cpu.dtype)),
            seq_lens_cpu_upper_bound=host_minus(cad.seq_lens_cpu_upper_bound),
        )
        run_pass(
            num_speculative_tokens=0,
            target_token_ids=self.token_ids.index_select(0, gather_d),
            target_positions=self.positions.index_select(0, gather_d),
            target_hidden_states=self.hidden.index_select(0, gather_d),
            next_token_ids=next_token_ids,
            token_indices_to_sample=None,
            common_attn_metadata=flush_cad,
            sampling_metadata=kwargs["sampling_metadata"],
            mm_embed_inputs=None,
            num_rejected_tokens_gpu=None,
            slot_mappings=None,
        )

    def _write_kv_only(self, gather: np.ndarray, counts: np.ndarray, first: np.ndarray,
                       step_token_ids: torch.Tensor) -> None:
        """The kept tokens' drafter KV through ``kv_writer``. Each kept token's input id is
        its successor, as in vLLM's first pass: the next kept token of its row, or for the
        row's last the step's first target token (``first``: its index in the step)."""
        n, rows = gather.size, counts.size
        last = np.cumsum(counts) - 1  # each row's last kept token, in gather order
        succ = gather + 1
        succ[last] = gather[last]  # a slot in the buffer; replaced below
        # One host-to-device copy for every index (see _run_full_pass).
        packed = self._to_device(np.concatenate([gather, succ, last, first]))
        gather_d, succ_d = packed[:n], packed[n:2 * n]
        last_d, first_d = packed[2 * n:2 * n + rows], packed[2 * n + rows:]
        input_ids = self.token_ids.index_select(0, succ_d)
        input_ids.index_copy_(0, last_d,
                              step_token_ids.index_select(0, first_d).to(input_ids.dtype))
        self.kv_writer(input_ids, self.positions.index_select(0, gather_d),
                       self.hidden.index_select(0, gather_d),
                       self.slot_mapping.index_select(0, gather_d))

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(
            self.device, non_blocking=True)


def inserts_next_token_slot(drafter) -> bool:
    """Whether the drafter's inserted slots still line up with kept tokens: true for the draft
    model (vLLM's ``DraftModelProposer``), which reads no hidden states and inserts exactly one
    slot per request, the next token at the position after the request's last (vLLM's
    ``set_inputs_first_pass``). A flush then passes the kept tokens unshifted with the step's
    first target token as the next token: the drafter writes its KV at the kept positions and
    at the step's first position, which the step's own pass writes again with the same token.
    Other inserted-slot layouts (parallel drafting, DFlash) are not mapped here."""
    return (drafter.needs_extra_input_slots and not drafter.pass_hidden_states_to_model
            and drafter.net_num_new_slots_per_request == 1
            and drafter.extra_slots_per_request == 1)


def make_deferred_sync(drafter, runner) -> DeferredDrafterSync | None:
    """The deferral for an EAGLE / EAGLE-3 / MTP drafter or a draft model, or None where it
    does not apply: switched off, other drafters that insert slots per request (kept tokens
    would not line up with their inputs, ``inserts_next_token_slot``), parallel drafting, M-RoPE /
    XD-RoPE positions, multimodal or heterogeneous-vocabulary drafters, and data parallelism
    (ranks would run different passes, and the drafter's collectives must match).

    The draft model was left out until issue 11's CPU run: its pass at k = 0 (1.9 ms at batch
    1, 2.4 ms at batch 8, against a 25-41 ms target step) held adaptive drafting on chat, where
    the controller drafts nothing most steps, at about 0.9x of no speculation."""
    from specdec_plugin import envs

    if runner is None or not envs.defer_drafter_sync():
        return None
    config = drafter.vllm_config
    extra_slot = drafter.needs_extra_input_slots
    if extra_slot and not inserts_next_token_slot(drafter):
        return None
    if extra_slot and getattr(drafter, "_graph_device", None) is not None \
            and not envs.drafter_padding():
        # With unpadded drafter graphs each flush shape would record a graph of its own.
        return None
    if (drafter.parallel_drafting or drafter.uses_mrope or drafter.uses_xdrope_dim > 0
            or drafter.supports_mm_inputs or getattr(drafter, "use_heterogeneous_vocab", False)
            or config.parallel_config.data_parallel_size > 1):
        return None
    max_reqs = drafter.max_batch_size
    depth = DEFAULT_DEPTH
    if drafter._graph_device is not None and envs.drafter_padding():
        # Flushes of at most 1+K tokens per request replay the padded k = 0 graph recorded at
        # start (drafter_padding.py); longer ones would run eagerly, launch by launch, which
        # on a GPU at small batch costs more than the graph replays they replace.
        depth = 1 + drafter.speculative_config.num_speculative_tokens
    # A flush is one pass over every kept token of a batch: it must fit the drafter's buffers.
    depth = min(depth, drafter.max_num_tokens // max(max_reqs, 1))
    if depth < 2:
        return None
    full_flush_depth = depth
    kv_only = kv_only_flush(config)
    if kv_only:
        # The writer is attached at load (drafter_graphs.py); a KV-only flush runs no pass.
        per_token = (drafter._target_hidden_width() * config.model_config.dtype.itemsize
                     + 4 + 8 + 8)  # hidden states, token id, position, slot
        depth = max(depth, min(KV_ONLY_DEPTH,
                               KV_ONLY_BUFFER_BYTES // (per_token * max(max_reqs, 1))))
    from specdec_plugin.adaptive.config import adaptive_enabled

    sync = DeferredDrafterSync(
        max_reqs, depth, drafter._target_hidden_width(), config.model_config.dtype,
        drafter.device, block_size=0,  # known once the KV cache exists (drafter.block_size)
        # Our adaptive scheduler keeps the blocks that may hold unwritten drafter KV out of
        # the prefix cache (below); under another scheduler, flush before a block fills.
        flush_before_block_fills=bool(config.cache_config.enable_prefix_caching)
        and not adaptive_enabled(config))
    sync.full_flush_depth, sync.wants_kv_writer = full_flush_depth, kv_only
    logger.info("specdec_plugin: drafter passes of steps that draft nothing are deferred (up "
                "to %d steps per request, %.1f MiB of buffers%s); SPECDEC_DEFER_DRAFTER_SYNC=0 "
                "turns this off", depth, sync.nbytes() / 2**20,
                ", flushes write the drafter's KV only" if kv_only else "")
    return sync


def kv_only_flush(vllm_config) -> bool:
    """Whether deferred flushes write the drafter's KV alone (drafter_kv_writer.py): single-
    layer EAGLE-family drafters of a registered architecture, unless SPECDEC_KV_ONLY_FLUSH=0."""
    from specdec_plugin import envs
    from specdec_plugin.spec_decode.drafter_kv_writer import kv_only_applies

    spec = vllm_config.speculative_config
    if spec is None or not spec.use_eagle() or not envs.kv_only_flush():
        return False
    draft = getattr(spec, "draft_model_config", None)
    if draft is None:
        return False
    return kv_only_applies(getattr(draft.hf_config, "architectures", None),
                           getattr(draft.hf_config, "num_hidden_layers", 0),
                           vllm_config.cache_config.cache_dtype)


def host_seq_lens(runner, cad: CommonAttentionMetadata) -> np.ndarray | None:
    """Each row's sequence length as the host knows it: exact where vLLM keeps it (no async
    speculative decoding), else its upper bound (every draft in flight accepted)."""
    for t in (cad._seq_lens_cpu, cad.seq_lens_cpu_upper_bound,
              getattr(runner, "optimistic_seq_lens_cpu", None)):
        if t is not None:
            return t[:cad.batch_size()].numpy()
    return None


# ---- the scheduler's side: prefix caching ----
# A full KV block is shared through vLLM's prefix cache, and a request that hits it reads the
# drafter's KV there too. The positions a request has kept but not yet written are its last
# ``depth`` at most, so where our adaptive scheduler runs, it takes the blocks holding a
# request's last positions out of the prefix cache when the request finishes or is preempted
# (``AdaptiveSchedulerMixin._free_request_blocks``): a later request recomputes those few
# tokens instead of reading stale drafter KV. The worker then need not flush before every
# block fills, which at batch 16 and more would force a flush almost every step. Under any
# other scheduler the worker flushes before a block fills (``flush_before_block_fills``).

def uncache_window(vllm_config) -> int | None:
    """How many of a request's last positions may hold drafter KV not yet written; None where
    no deferral runs with prefix caching."""
    from specdec_plugin import envs

    spec = vllm_config.speculative_config
    if (spec is None or not (spec.use_eagle() or spec.uses_draft_model())
            or not envs.defer_drafter_sync()
            or not vllm_config.cache_config.enable_prefix_caching):
        return None
    k = spec.num_speculative_tokens or 0
    # The deepest buffer (make_deferred_sync), plus the drafts in flight under async
    # scheduling, when the host's count of computed tokens runs ahead of the worker's.
    deepest = max(DEFAULT_DEPTH, 1 + k, KV_ONLY_DEPTH if kv_only_flush(vllm_config) else 0)
    return deepest + k + 1


def tail_block_ids(block_ids: Sequence[Sequence[int]], num_computed: int, block_size: int,
                   window: int) -> set[int]:
    """The ids of the blocks (of every KV cache group) holding positions
    ``[num_computed - window, num_computed)``."""
    if num_computed <= 0 or block_size <= 0:
        return set()
    first = max(num_computed - window, 0) // block_size
    last = (num_computed - 1) // block_size
    return {ids[i] for ids in block_ids for i in range(first, min(last + 1, len(ids)))}
