"""Triton paged attention: same contract as ``reference.paged_attention`` (see the package doc).

Work split. One program owns (request, query tile, kv head[, kv split]). Its rows are the
``BLOCK_Q`` query tokens of the tile times the ``Hq / Hkv`` query heads that share the kv head,
flattened as ``row = token * GROUP_PAD + head``, so each K/V tile is read once for the whole
group and one ``tl.dot`` covers it. For decode and 1+K verification ``BLOCK_Q`` covers the
request's whole query, so the K+1 positions of a speculative step cost one pass over the cache,
not K+1. Softmax is online (flash-attention), accumulated in fp32, in base 2 with the scale
folded into the query.

Split-KV (flash-decoding). When the grid above is too small to fill the GPU (few requests,
single query tile, long context), each program also takes one of ``NUM_SPLITS`` contiguous
slices of its request's keys and writes an unnormalised partial (acc, running max, running sum)
to a workspace; a second kernel merges the slices. Unlike vLLM's Triton backend this also
applies to multi-token verification tiles, which is where spec decode at small batch sits.
The slice bounds come from ``seq_lens`` on the device, so a launch fixed at graph capture is
right for any later sequence lengths. The host plans the split count for the longest context a
launch can see (``plan_seq_len``: max_model_len in a captured graph), so most requests are far
shorter than planned: each request's keys go into slices of at least ``split_min_keys``, only
the slices that hold keys run (the others return at once and the merge reads none of them), and
a request whose keys fit in one slice is written unsplit, its merge program returning at once.
The merge runs one warp per (query row, head): its [splits, head] tile then reduces over the
splits inside each thread. Session 46's profile (EAGLE-3 verifying at batch 16, 2 splits) had
the merge, at four warps, take 10 us per layer against the attention's 12.5; one warp cut the
pair from 17.2 to 11.6 us (H200, 150-key contexts; benchmarks/bench_attention_splits.py).

Few compiled variants: a Triton kernel compiles once per set of constexpr values and per
integer argument that equals 1 or is a multiple of 16, and a compile in the middle of serving
stalls that step for a second or more. So the split count is a runtime argument (only "split or
not" is a constexpr), sizes that change from step to step are not specialised, and the query tile
takes three sizes: 1 (decode, drafting), 8 (verification of up to 1+7 tokens) and the largest
(prefill). The variants a server needs are then all compiled by its first steps.

Graph safety: nothing here reads device values on the host. The host picks tile sizes from
``max_query_len`` and the split count from ``max_seq_len`` / batch size (heuristics only;
results are exact for any seq_lens). The split workspace is cached per device and never freed
once handed to a launch, so a captured graph never points at released memory; while a graph is
being captured a workspace that is too small is not grown: that launch runs unsplit instead.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

# Module names of their own: the tests replace them here to plan splits for an H100 on a CPU.
from specdec_plugin.ops.gpu_props import cuda_index as _device_index
from specdec_plugin.ops.gpu_props import sm_count as _sm_count
from specdec_plugin.ops.paged_attention.triton_kv_write import _write_new_kv
from specdec_plugin.ops.paged_attention.validate import check_paged_attention, check_write_kv

# Running max starts finite so a row whose keys are all masked in one tile/split gives
# exp2(-inf - (-1e30)) = 0 rather than exp2(-inf - -inf) = NaN.
_M_INIT = tl.constexpr(-1.0e30)
_LOG2E = 1.4426950408889634
_MAX_BLOCK_M = 128
_MAX_SPLITS = 16
# Fewest keys per slice: the host plans splits with it, and on the device each request's slices
# are at least this long (rounded up to whole tiles), so requests shorter than the plan use fewer.
_MIN_KEYS_PER_SPLIT = 64
# Host-bound callers (see ``paged_attention``): the merge launch costs more host time than an
# unsplit kernel loses on the GPU until a program has several thousand keys to read.
_MIN_KEYS_PER_SPLIT_HOST_BOUND = 1024
# Query tile for 2..8-token queries (1+K verification up to K = 7, short prefills).
_VERIFY_BLOCK_Q = 8
# Split until the grid has about this many programs per SM. Measured on an H100 (bf16, head 128,
# decode and 1+4 verification, batch 1-16, context 512-8k): 16-row tiles gain up to 10% from 4,
# 32-row tiles lose up to 15% with 4 and do best with 2.
_PROGRAMS_PER_SM_SMALL_TILE = 4
_PROGRAMS_PER_SM = 2
# Warps of one merge program (one query row and head: a [MAX_SPLITS, HEAD_PAD] tile). With one,
# each thread holds whole columns and sums the slices alone; with four (before session 46) the
# slices sat across warps and summed through shared memory, 1.3-1.5x slower over the pair.
_MERGE_NUM_WARPS = 1


@triton.jit
def _split_range(kv_end, split, num_splits, split_min_keys, block_n):
    """Keys [kv_lo, kv_hi) of slice ``split`` of a request with ``kv_end`` keys, and how many
    slices hold keys (``live``). Slices are whole ``block_n`` tiles, at least
    ``split_min_keys`` (a multiple of ``block_n``) long, so a short request uses few slices,
    maybe one. The merge kernel calls this too: both must agree on ``live``."""
    n_tiles = (kv_end + block_n - 1) // block_n
    keys_per_split = tl.maximum(split_min_keys,
                                ((n_tiles + num_splits - 1) // num_splits) * block_n)
    live = (kv_end + keys_per_split - 1) // keys_per_split
    kv_lo = split * keys_per_split
    kv_hi = tl.minimum(kv_end, kv_lo + keys_per_split)
    return kv_lo, kv_hi, live


@triton.jit
def _store_rows(out_ptr, token, q_head, dims, stride_ot, stride_oh, acc, l_i, mask):
    out = acc / l_i[:, None]
    tl.store(out_ptr + token[:, None] * stride_ot + q_head[:, None] * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask)


# Sizes that vary from step to step are not specialised (see "Few compiled variants").
@triton.jit(do_not_specialize=["num_q_tiles", "max_query_len", "num_splits", "split_min_keys"])
def _attention_tile_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, query_start_loc_ptr, seq_lens_ptr,
    out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr,
    key_ptr, value_ptr, slot_mapping_ptr,  # this step's K/V rows (WRITE_KV only)
    stride_knt, stride_knh, stride_vnt, stride_vnh,
    qk_scale,  # softmax scale * log2(e)
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    stride_ot, stride_oh,
    num_q_tiles, max_query_len, num_splits, split_min_keys,
    NUM_Q_HEADS: tl.constexpr,
    CACHE_BLOCK: tl.constexpr,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD: tl.constexpr, HEAD_PAD: tl.constexpr,
    SPLIT_KV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    WRITE_KV: tl.constexpr,
):
    pid = tl.program_id(0)
    seq = pid // num_q_tiles
    tile = pid % num_q_tiles
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    tile_q0 = tile * BLOCK_Q
    if tile_q0 >= q_len:  # also covers graph-padding requests (q_len == 0)
        return
    # Query token j of the request sits at absolute position seq_len - q_len + j.
    context_len = seq_len - q_len
    kv_end = context_len + tl.minimum(q_len, tile_q0 + BLOCK_Q)
    if SPLIT_KV:
        kv_lo, kv_hi, live = _split_range(kv_end, split, num_splits, split_min_keys, BLOCK_N)
        if split >= live:  # no keys in this slice: nothing to write, the merge skips it
            return
    else:
        kv_lo = 0
        kv_hi = kv_end
        live = 1

    rows = tl.arange(0, BLOCK_M)
    q_tok = tile_q0 + rows // GROUP_PAD
    head_in_group = rows % GROUP_PAD
    row_valid = (q_tok < q_len) & (head_in_group < GROUP)
    q_head = kv_head * GROUP + head_in_group
    dims = tl.arange(0, HEAD_PAD)
    dim_valid = dims < HEAD

    token = (q_start + q_tok).to(tl.int64)
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + q_head[:, None] * stride_qh + dims[None, :],
        mask=row_valid[:, None] & dim_valid[None, :], other=0.0,
    )
    q_pos = context_len + q_tok

    m_i = tl.full([BLOCK_M], _M_INIT, dtype=tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, dtype=tl.float32)
    acc = tl.full([BLOCK_M, HEAD_PAD], 0.0, dtype=tl.float32)

    table_row = block_table_ptr + seq.to(tl.int64) * stride_bt
    k_head = k_cache_ptr + kv_head.to(tl.int64) * stride_kh
    v_head = v_cache_ptr + kv_head.to(tl.int64) * stride_vh
    if WRITE_KV:
        _write_new_kv(key_ptr, value_ptr, slot_mapping_ptr, stride_knt, stride_knh, stride_vnt,
                      stride_vnh, k_head, v_head, stride_kb, stride_ks, stride_vb, stride_vs,
                      kv_head, q_start, context_len, kv_lo, kv_hi, dims, dim_valid,
                      CACHE_BLOCK, BLOCK_N)
        tl.debug_barrier()  # the block's stores are visible to all its threads' loads below
    for start in range(kv_lo, kv_hi, BLOCK_N):
        k_pos = start + tl.arange(0, BLOCK_N)
        k_valid = k_pos < kv_hi
        block = tl.load(table_row + k_pos // CACHE_BLOCK, mask=k_valid, other=0).to(tl.int64)
        slot = k_pos % CACHE_BLOCK
        kT = tl.load(
            k_head + block[None, :] * stride_kb + slot[None, :] * stride_ks + dims[:, None],
            mask=k_valid[None, :] & dim_valid[:, None], other=0.0,
        )  # [HEAD_PAD, BLOCK_N]
        v = tl.load(
            v_head + block[:, None] * stride_vb + slot[:, None] * stride_vs + dims[None, :],
            mask=k_valid[:, None] & dim_valid[None, :], other=0.0,
        )  # [BLOCK_N, HEAD_PAD]

        s = tl.dot(q, kT.to(q.dtype), input_precision=DOT_PRECISION) * qk_scale
        visible = (k_pos[None, :] <= q_pos[:, None]) & k_valid[None, :]
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(
            p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
        m_i = m_new

    q_head_valid = row_valid[:, None] & dim_valid[None, :]
    if live == 1:  # the whole request in one slice (always so unsplit): no partials, no merge
        _store_rows(out_ptr, token, q_head, dims, stride_ot, stride_oh, acc, l_i, q_head_valid)
    else:
        # Partials are indexed by (request, query index, q head, split), not by token, so the
        # workspace size depends only on the launch shape. A request longer than max_query_len
        # (caller error) must not write past it.
        part_valid = row_valid & (q_tok < max_query_len)
        prow = ((seq * max_query_len + q_tok) * NUM_Q_HEADS + q_head).to(tl.int64)
        prow = prow * num_splits + split
        tl.store(part_acc_ptr + prow[:, None] * HEAD_PAD + dims[None, :], acc,
                 mask=part_valid[:, None] & dim_valid[None, :])
        tl.store(part_max_ptr + prow, m_i, mask=part_valid)
        tl.store(part_sum_ptr + prow, l_i, mask=part_valid)


@triton.jit(do_not_specialize=["max_query_len", "num_splits", "split_min_keys", "block_q",
                               "block_n"])
def _merge_splits_kernel(
    part_acc_ptr, part_max_ptr, part_sum_ptr, query_start_loc_ptr, seq_lens_ptr, out_ptr,
    stride_ot, stride_oh, max_query_len, num_splits, split_min_keys, block_q, block_n,
    NUM_Q_HEADS: tl.constexpr, HEAD: tl.constexpr, HEAD_PAD: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
):
    pid = tl.program_id(0)
    seq = pid // max_query_len
    j = pid % max_query_len
    q_head = tl.program_id(1)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if j >= q_len:
        return
    # The slices the attention kernel wrote for query j's tile (``_split_range``, with the
    # tile's kv_end); one slice means it wrote the output itself.
    tile_q0 = (j // block_q) * block_q
    kv_end = tl.load(seq_lens_ptr + seq) - q_len + tl.minimum(q_len, tile_q0 + block_q)
    num_live = _split_range(kv_end, 0, num_splits, split_min_keys, block_n)[2]
    if num_live <= 1:
        return

    splits = tl.arange(0, MAX_SPLITS)
    live = splits < num_live
    dims = tl.arange(0, HEAD_PAD)
    prow = ((seq * max_query_len + j) * NUM_Q_HEADS + q_head).to(tl.int64) * num_splits + splits
    m = tl.load(part_max_ptr + prow, mask=live, other=_M_INIT)
    l = tl.load(part_sum_ptr + prow, mask=live, other=0.0)
    acc = tl.load(part_acc_ptr + prow[:, None] * HEAD_PAD + dims[None, :], mask=live[:, None],
                  other=0.0)
    # Slices past num_live were never written this launch: masked, they read as m = -1e30,
    # l = 0, acc = 0, whose weight underflows to 0.
    weight = tl.math.exp2(m - tl.max(m, axis=0))
    out = tl.sum(acc * weight[:, None], axis=0) / tl.sum(l * weight, axis=0)
    token = (q_start + j).to(tl.int64)
    tl.store(out_ptr + token * stride_ot + q_head * stride_oh + dims,
             out.to(out_ptr.dtype.element_ty), mask=dims < HEAD)


# ---------------------------------------------------------------------------------------------
# Host side: tile choice, split heuristic, workspace.

_workspaces: dict[torch.device, torch.Tensor] = {}
_retired_workspaces: list[torch.Tensor] = []  # kept alive: captured graphs may point at them
# (device, rows, head_pad) -> (the workspace the views were cut from, (acc, max, sum) views).
_split_views: dict[tuple, tuple[torch.Tensor, tuple]] = {}


def _workspace(numel: int, device: torch.device) -> torch.Tensor | None:
    ws = _workspaces.get(device)
    if ws is not None and ws.numel() >= numel:
        return ws[:numel]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    if ws is not None:
        _retired_workspaces.append(ws)
    ws = torch.empty(max(numel, 2 * (ws.numel() if ws is not None else 0)),
                     dtype=torch.float32, device=device)
    _workspaces[device] = ws
    return ws[:numel]


def _tile_shape(max_query_len: int, group: int, head_pad: int, dtype: torch.dtype):
    group_pad = triton.next_power_of_2(group)
    largest_q = max(1, _MAX_BLOCK_M // group_pad)
    # Three query tiles only (see "Few compiled variants"): 1, a verification tile, the largest.
    if max_query_len == 1:
        block_q = 1
    elif max_query_len <= _VERIFY_BLOCK_Q:
        block_q = min(_VERIFY_BLOCK_Q, largest_q)
    else:
        block_q = largest_q
    block_m = max(16, block_q * group_pad)
    # Keep the [BLOCK_N, HEAD] K and V tiles and the [BLOCK_M, BLOCK_N] scores in registers.
    block_n = 64 if head_pad <= 128 and dtype != torch.float32 else 32
    return group_pad, block_q, block_m, block_n


def variant_query_lengths(num_q_heads: int, num_kv_heads: int) -> tuple[int, ...]:
    """One ``max_query_len`` per query-tile class (decode, verification, the largest single
    tile): with a long and a short ``plan_seq_len`` each, they launch every variant serving
    needs (worker/kernel_warmup.py compiles them at engine start)."""
    group_pad = triton.next_power_of_2(max(1, num_q_heads // num_kv_heads))
    largest_q = max(1, _MAX_BLOCK_M // group_pad)
    return tuple(sorted({1, min(2, largest_q), largest_q}))


def _choose_splits(base_programs: int, block_m: int, max_seq_len: int, device_index: int,
                   min_keys_per_split: int = _MIN_KEYS_PER_SPLIT) -> int:
    per_sm = _PROGRAMS_PER_SM_SMALL_TILE if block_m <= 16 else _PROGRAMS_PER_SM
    target = per_sm * _sm_count(device_index)
    splits = 1
    while (splits < _MAX_SPLITS and base_programs * splits * 2 <= target
           and max_seq_len >= 2 * splits * min_keys_per_split):
        splits *= 2
    return splits


class _Plan(NamedTuple):
    group: int
    group_pad: int
    block_q: int
    block_m: int
    block_n: int
    head_pad: int
    num_q_tiles: int
    num_splits: int
    split_min_keys: int
    num_warps: int


@functools.lru_cache(maxsize=1024)
def _launch_plan(num_seqs: int, max_query_len: int, num_q_heads: int, num_kv_heads: int,
                 head: int, dtype: torch.dtype, device_index: int | None, plan_len: int,
                 min_keys_per_split: int, num_splits: int | None,
                 split_min_keys: int | None = None) -> _Plan:
    """Everything the host decides for one launch shape (cached: an eager step re-asks for the
    same few shapes in every layer, and this is host time on the critical path)."""
    group = num_q_heads // num_kv_heads
    head_pad = max(16, triton.next_power_of_2(head))
    group_pad, block_q, block_m, block_n = _tile_shape(max_query_len, group, head_pad, dtype)
    num_q_tiles = triton.cdiv(max_query_len, block_q)
    if num_splits is None:
        num_splits = 1
        if device_index is not None and num_q_tiles == 1:
            num_splits = _choose_splits(num_seqs * num_kv_heads, block_m, plan_len,
                                        device_index, min_keys_per_split)
    if split_min_keys is None:
        split_min_keys = min_keys_per_split
    split_min_keys = triton.cdiv(split_min_keys, block_n) * block_n
    big_tile = block_m * head_pad >= 128 * 64
    return _Plan(group, group_pad, block_q, block_m, block_n, head_pad, num_q_tiles, num_splits,
                 split_min_keys, 8 if big_tile else 4)


# Each split buffer starts on a multiple of this many float32s (16 bytes). Triton specialises a
# pointer argument by 16-byte alignment, so a buffer that starts off it compiles another kernel
# variant, in the middle of serving. With back-to-back views the sum buffer started at
# rows * (head_pad + 1) floats, off 16 bytes whenever rows was not a multiple of 4: with two
# splits and an odd count of requests times heads (SmolLM2's 9 heads, its draft model's 3).
_SPLIT_ALIGN = 4


def _split_sections(rows: int, head_pad: int) -> tuple[int, int, int]:
    """Start of the max and sum buffers, and the workspace length, for ``rows`` partial rows."""
    padded = -(-rows // _SPLIT_ALIGN) * _SPLIT_ALIGN
    max_start = rows * head_pad  # a multiple of 16 floats: head_pad is
    sum_start = max_start + padded
    return max_start, sum_start, sum_start + padded


def _split_buffers(rows: int, head_pad: int, device: torch.device):
    """(acc, max, sum) views of the workspace for ``rows`` partial rows, each 16-byte aligned,
    or None (see ``_workspace``). The views are cached until the workspace is replaced."""
    key = (device, rows, head_pad)
    cached = _split_views.get(key)
    if cached is not None and cached[0] is _workspaces.get(device):
        return cached[1]
    max_start, sum_start, numel = _split_sections(rows, head_pad)
    ws = _workspace(numel, device)
    if ws is None:
        return None
    views = (ws[:max_start], ws[max_start: max_start + rows], ws[sum_start: sum_start + rows])
    _split_views[key] = (_workspaces[device], views)
    return views


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    host_bound: bool = False,
    plan_seq_len: int = 0,
) -> torch.Tensor:
    """Write attention for every real query row into ``out`` (same shape as ``query``).

    ``plan_seq_len``: the context length the split heuristic plans for (at least
    ``max_seq_len``), the value ``reserve_workspace`` returned: max_model_len in the engine.
    Graph capture sees max_seq_len = max_model_len while eager steps see the batch's real
    lengths; planning both for the same length gives a request the same split count (so the
    same summation order) in a captured decode graph and in an eager mixed batch, so bf16
    greedy output does not flip on near-ties between those two paths. It is an argument, not
    process state, so the same inputs always give the same plan.

    ``host_bound``: the caller launches eagerly in a loop whose speed is set by host launch
    cost (a drafter's steps: vLLM runs drafter attention outside CUDA graphs), and its results
    need not match a captured graph's summation order. The KV is then split (a second, merge
    launch) only for long contexts, planned from this step's real ``max_seq_len``.
    """
    return paged_attention_splits(query, key_cache, value_cache, block_table, query_start_loc,
                                  seq_lens, scale, out, max_query_len, max_seq_len, None,
                                  host_bound, plan_seq_len)


def paged_attention_write_kv(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
    value_cache: torch.Tensor, slot_mapping: torch.Tensor, block_table: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float, out: torch.Tensor,
    max_query_len: int, max_seq_len: int, host_bound: bool = False, plan_seq_len: int = 0,
) -> torch.Tensor:
    """``reshape_and_cache`` of the query tokens' K/V, then ``paged_attention``, in one launch
    (plus the merge where the KV is split): each program stores the new keys of its own KV
    range before it reads them (``triton_kv_write.py``). Contract: the package docstring.
    ``paged_attention_splits`` checks the attention's own arguments."""
    check_write_kv(key, value, key_cache, value_cache, slot_mapping, query_start_loc,
                   seq_lens.shape[0])
    return paged_attention_splits(query, key_cache, value_cache, block_table, query_start_loc,
                                  seq_lens, scale, out, max_query_len, max_seq_len, None,
                                  host_bound, plan_seq_len, new_kv=(key, value, slot_mapping))


def paged_attention_splits(
    query, key_cache, value_cache, block_table, query_start_loc, seq_lens, scale, out,
    max_query_len: int, max_seq_len: int, num_splits: int | None, host_bound: bool = False,
    plan_seq_len: int = 0, split_min_keys: int | None = None, new_kv: tuple | None = None,
) -> torch.Tensor:
    """``paged_attention`` with the KV split count forced (``None``: heuristic), and the
    fewest keys per slice (``None``: the default). For tests and benchmarks. ``new_kv``:
    ``(key, value, slot_mapping)`` to store first, in the same launch."""
    check_paged_attention(query, key_cache, value_cache, block_table, query_start_loc,
                          seq_lens, out, max_query_len, max_seq_len)
    num_seqs = seq_lens.shape[0]
    if num_seqs == 0 or max_query_len == 0 or max_seq_len == 0:
        return out
    num_q_heads, head = query.shape[1], query.shape[2]
    num_kv_heads = key_cache.shape[2]
    device = query.device
    device_index = _device_index(device)
    if host_bound:
        # Round up so that a growing context asks for few distinct plans.
        plan_len, min_keys = triton.next_power_of_2(max_seq_len), _MIN_KEYS_PER_SPLIT_HOST_BOUND
    else:
        plan_len = max(max_seq_len, plan_seq_len)
        min_keys = _MIN_KEYS_PER_SPLIT
    plan = _launch_plan(num_seqs, max_query_len, num_q_heads, num_kv_heads, head, query.dtype,
                        device_index, plan_len, min_keys, num_splits, split_min_keys)
    assert 1 <= plan.num_splits <= _MAX_SPLITS, f"num_splits must be 1..{_MAX_SPLITS}"
    num_splits = plan.num_splits
    part_acc = part_max = part_sum = out  # placeholders, unused when unsplit
    if num_splits > 1:
        buffers = _split_buffers(num_seqs * max_query_len * num_q_heads * num_splits,
                                 plan.head_pad, device)
        if buffers is None:
            num_splits = 1
        else:
            part_acc, part_max, part_sum = buffers

    # Without new K/V the pointers are placeholders that WRITE_KV=False compiles away.
    key, value, slot_mapping = new_kv if new_kv is not None else (query, query, seq_lens)
    _attention_tile_kernel[(num_seqs * plan.num_q_tiles, num_kv_heads, num_splits)](
        query, key_cache, value_cache, block_table, query_start_loc, seq_lens,
        out, part_acc, part_max, part_sum,
        key, value, slot_mapping, key.stride(0), key.stride(1), value.stride(0),
        value.stride(1),
        scale * _LOG2E,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_table.stride(0),
        out.stride(0), out.stride(1),
        plan.num_q_tiles, max_query_len, num_splits, plan.split_min_keys,
        NUM_Q_HEADS=num_q_heads, CACHE_BLOCK=key_cache.shape[1],
        GROUP=plan.group, GROUP_PAD=plan.group_pad,
        BLOCK_Q=plan.block_q, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
        HEAD=head, HEAD_PAD=plan.head_pad, SPLIT_KV=num_splits > 1,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        WRITE_KV=new_kv is not None,
        num_warps=plan.num_warps, num_stages=2,
    )
    if num_splits > 1:
        _merge_splits_kernel[(num_seqs * max_query_len, num_q_heads)](
            part_acc, part_max, part_sum, query_start_loc, seq_lens, out,
            out.stride(0), out.stride(1), max_query_len, num_splits, plan.split_min_keys,
            plan.block_q, plan.block_n,
            NUM_Q_HEADS=num_q_heads, HEAD=head, HEAD_PAD=plan.head_pad, MAX_SPLITS=_MAX_SPLITS,
            num_warps=_MERGE_NUM_WARPS,
        )
    return out


def reserve_workspace(max_num_seqs: int, query_lens: tuple[int, ...], num_q_heads: int,
                      num_kv_heads: int, head_size: int, max_seq_len: int, dtype: torch.dtype,
                      device: torch.device) -> int:
    """Allocate, before graph capture, the largest split-KV workspace any launch can ask for,
    and return the ``plan_seq_len`` those launches must pass (``max_seq_len``) so that they
    split as this reservation planned.

    Captured launches cannot grow the workspace (they would run unsplit, slower at small
    batch), so the metadata builder calls this once per layer group with the step shapes it
    will see: every batch of up to ``max_num_seqs`` requests at each query length in
    ``query_lens`` (1 for decode and drafting, 1+K for verification).
    """
    index = _device_index(device)
    if index is None:
        return max_seq_len
    head_pad = max(16, triton.next_power_of_2(head_size))
    group = num_q_heads // num_kv_heads
    largest = 0
    for query_len in query_lens:
        _, _, block_m, _ = _tile_shape(query_len, group, head_pad, dtype)
        for num_seqs in range(1, max_num_seqs + 1):
            splits = _choose_splits(num_seqs * num_kv_heads, block_m, max_seq_len, index)
            if splits == 1:
                break  # more requests never split again
            largest = max(largest, num_seqs * query_len * num_q_heads * splits)
    if largest:
        _workspace(_split_sections(largest, head_pad)[2], device)
    return max_seq_len
