"""The deferred drafter KV sync's buffers (spec_decode/deferred_sync.py), without an engine.

Requests join, leave, are reordered and overflow their buffers over a scripted run of steps.
Every drafter pass (the deferred flushes and the steps' own passes) is replayed into a fake
drafter KV cache as vLLM's first pass builds its inputs (each query shifted by one token, the
last input the request's next token); the result must equal the KV of a run that passes
every step, slot for slot."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from vllm.v1.attention.backend import CommonAttentionMetadata

from specdec_plugin.spec_decode.deferred_sync import DeferredDrafterSync

WIDTH, DEPTH = 4, 3


def _token(req: str, pos: int) -> int:
    return 1000 * (ord(req) - ord("A")) + pos


def _slot(req: str, pos: int) -> int:
    return 100_000 * (ord(req) - ord("A") + 1) + pos


def _hidden(req: str, pos: int) -> list[float]:
    return [float(_token(req, pos)) + i / 10 for i in range(WIDTH)]


def _step_kwargs(batch: list[tuple[str, int, int]], k: int = 0) -> dict:
    """``batch``: (request, first position, query length) per row, in row order."""
    tokens, positions, hidden, slots, next_ids, starts, seq_lens = [], [], [], [], [], [0], []
    for req, pos, q in batch:
        span = range(pos, pos + q)
        tokens += [_token(req, p) for p in span]
        positions += list(span)
        hidden += [_hidden(req, p) for p in span]
        slots += [_slot(req, p) for p in span]
        next_ids.append(_token(req, pos + q))
        starts.append(starts[-1] + q)
        seq_lens.append(pos + q)
    qsl = torch.tensor(starts, dtype=torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    cad = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq,
        num_reqs=len(batch), num_actual_tokens=len(tokens), max_query_len=max(q for *_, q in batch),
        max_seq_len=int(seq.max()),
        # One block-table row per request, naming it: the flush must pick the right rows.
        block_table_tensor=torch.tensor([[ord(r)] for r, _, _ in batch], dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64), _seq_lens_cpu=seq.clone())
    return dict(num_speculative_tokens=k, target_token_ids=torch.tensor(tokens, dtype=torch.int32),
                target_positions=torch.tensor(positions, dtype=torch.int64),
                target_hidden_states=torch.tensor(hidden), next_token_ids=torch.tensor(next_ids),
                token_indices_to_sample=None, common_attn_metadata=cad, sampling_metadata=None,
                mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None)


class FakeDrafterKV:
    """What vLLM's first pass writes: at each query token's slot, the next token's id, the
    token's position and its target hidden state."""

    def __init__(self):
        self.kv: dict[int, tuple] = {}
        self.passes: list[dict] = []

    def __call__(self, **kw):
        self.passes.append(kw)
        cad = kw["common_attn_metadata"]
        starts = cad.query_start_loc_cpu.tolist()
        ids = kw["target_token_ids"].tolist()
        for row in range(cad.batch_size()):
            lo, hi = starts[row], starts[row + 1]
            # The sequence length must end at the last query token; the block table must be the
            # row's own request.
            assert int(cad.seq_lens[row]) == int(kw["target_positions"][hi - 1]) + 1
            assert int(cad.block_table_tensor[row, 0]) == ord("A") + _token_req(ids[lo])
            inputs = ids[lo + 1:hi] + [int(kw["next_token_ids"][row])]
            for i in range(lo, hi):
                self.kv[int(cad.slot_mapping[i])] = (
                    inputs[i - lo], int(kw["target_positions"][i]),
                    tuple(kw["target_hidden_states"][i].tolist()))
        return torch.empty(cad.batch_size(), 0, dtype=torch.int64)


def _token_req(token: int) -> int:
    return token // 1000


def _run(script, sync: DeferredDrafterSync | None, kv: FakeDrafterKV | None = None):
    """Runs ``script`` (list of (batch, k) or ("forget", ids)); returns the fake KV, the
    number of passes and which steps were deferred."""
    kv, deferred = kv or FakeDrafterKV(), []
    for entry in script:
        if entry[0] == "forget":
            if sync is not None:
                sync.forget(entry[1])
            continue
        batch, k = entry
        kwargs = _step_kwargs(batch, k)
        req_ids = [r for r, _, _ in batch]
        seq = kwargs["common_attn_metadata"]._seq_lens_cpu.numpy()
        if sync is not None and sync.step(k, req_ids, kwargs, seq, 0, kv):
            deferred.append(True)
            continue
        deferred.append(False)
        kv(**kwargs)
    return kv, deferred


def _sync(depth=DEPTH, block_size=16, flush_before_block_fills=False, max_reqs=4):
    return DeferredDrafterSync(max_reqs, depth, WIDTH, torch.float32, torch.device("cpu"),
                               block_size, flush_before_block_fills)


# Requests join, leave, swap rows, prefill, overflow their buffers, draft and verify.
SCRIPT = [
    ([("A", 0, 3), ("B", 0, 2)], 0),            # prefills: their own pass
    ([("A", 3, 1), ("B", 2, 1)], 0),            # deferred
    ([("B", 3, 1), ("A", 4, 1)], 0),            # deferred, rows swapped
    ([("A", 5, 1)], 0),                         # B not scheduled: keeps its tokens
    ([("C", 0, 4), ("B", 4, 1), ("A", 6, 1)], 0),  # C prefills: A and B flushed first
    ([("A", 7, 1), ("C", 4, 1), ("B", 5, 1)], 0),
    ([("A", 8, 1), ("C", 5, 1), ("B", 6, 1)], 0),
    ([("A", 9, 1), ("C", 6, 1), ("B", 7, 1)], 0),
    ([("A", 10, 1), ("C", 7, 1), ("B", 8, 1)], 0),  # buffers full: flush, then keep
    ([("C", 8, 1), ("A", 11, 1)], 0),
    ([("C", 9, 1), ("A", 12, 1), ("B", 9, 1)], 2),  # drafts: flush, then its own pass
    ([("A", 13, 3), ("C", 10, 1), ("B", 10, 1)], 0),  # a verification (3 tokens): no deferral
    ([("A", 14, 1), ("C", 11, 1), ("B", 11, 1)], 0),
    ([("A", 15, 1), ("C", 12, 1), ("B", 12, 1)], 1),
]


def test_deferred_passes_write_the_same_kv_as_every_step():
    script = SCRIPT
    sync = _sync()
    got, deferred = _run(script, sync)
    want, _ = _run(script, None)
    assert deferred == [False, True, True, True, False, True, True, True, True, True, False,
                        False, True, False]
    assert got.kv == want.kv
    # Fewer passes: 14 steps, 9 of them deferred, 4 flushes (steps 5, 9, 11, 14).
    assert len(want.passes) == 14 and len(got.passes) == 5 + 4
    assert sync.flushes == 4 and sync.deferred_steps == 9
    assert all(sync.pending(r) == 0 for r in "ABC")


def test_flush_inputs_match_the_skipped_passes():
    sync, kv = _sync(), FakeDrafterKV()
    for pos in range(1, 4):
        assert sync.step(0, ["A"], _step_kwargs([("A", pos, 1)]), None, 0, kv)
    assert sync.pending("A") == 3 and not kv.passes
    assert not sync.step(1, ["A"], _step_kwargs([("A", 4, 1)], k=1), None, 0, kv)
    [flush] = kv.passes
    assert flush["num_speculative_tokens"] == 0
    assert flush["target_token_ids"].tolist() == [_token("A", p) for p in (1, 2, 3)]
    assert flush["target_positions"].tolist() == [1, 2, 3]
    assert flush["next_token_ids"].tolist() == [_token("A", 4)]
    assert flush["common_attn_metadata"].slot_mapping.tolist() == [_slot("A", p) for p in (1, 2, 3)]
    assert flush["common_attn_metadata"]._seq_lens_cpu.tolist() == [4]
    assert flush["common_attn_metadata"]._num_computed_tokens_cpu.tolist() == [1]
    torch.testing.assert_close(flush["target_hidden_states"],
                               torch.tensor([_hidden("A", p) for p in (1, 2, 3)]), rtol=0, atol=0)


def test_finished_or_preempted_requests_lose_their_tokens():
    script = [
        ([("A", 0, 2), ("B", 0, 2)], 0),
        ([("A", 2, 1), ("B", 2, 1)], 0),
        ([("A", 3, 1), ("B", 3, 1)], 0),
        ("forget", ["B"]),
        ([("A", 4, 1), ("D", 0, 2)], 0),  # D takes B's buffer row
        ([("A", 5, 1), ("D", 2, 1)], 0),
        ([("D", 3, 1), ("A", 6, 1)], 1),
    ]
    sync = _sync()
    got, _ = _run(script, sync)
    want, _ = _run(script, None)
    lost = {_slot("B", 2), _slot("B", 3)}
    assert sync.dropped_tokens == 2
    assert set(want.kv) - set(got.kv) == lost
    assert {s: v for s, v in want.kv.items() if s not in lost} == got.kv


def test_a_request_forgotten_in_an_unchanged_batch_keeps_nothing_stale():
    # The buffer rows of an unchanged batch are looked up once (``_rows_of``); a request that is
    # preempted and resumed between two steps of the same batch must still start afresh, and
    # the runner's every-step forget of no request must not cost the lookup again.
    script = [
        ([("A", 0, 2), ("B", 0, 2)], 0),
        ([("A", 2, 1), ("B", 2, 1)], 0),
        ("forget", []),
        ([("A", 3, 1), ("B", 3, 1)], 0),
        ("forget", ["B"]),                # preempted and resumed: same batch, same order
        ([("A", 4, 1), ("B", 4, 1)], 0),
        ([("C", 9, 1), ("A", 5, 1), ("B", 5, 1)], 0),  # C takes a free row first
        ([("C", 10, 1), ("A", 6, 1), ("B", 6, 1)], 1),
    ]
    sync = _sync()
    got, deferred = _run(script, sync)
    want, _ = _run(script, None)
    assert deferred == [False, True, True, True, True, False]
    lost = {_slot("B", 2), _slot("B", 3)}
    assert sync.dropped_tokens == 2
    assert set(want.kv) - set(got.kv) == lost
    assert {s: v for s, v in want.kv.items() if s not in lost} == got.kv
    key = sync._rows_key
    assert key is not None
    sync.forget([])
    assert sync._rows_key is key


def test_unknown_rows_drop_everything_and_defer_nothing():
    sync, kv = _sync(), FakeDrafterKV()
    assert sync.step(0, ["A"], _step_kwargs([("A", 1, 1)]), None, 0, kv)
    # The runner names fewer requests than the step has rows.
    assert not sync.step(0, ["A"], _step_kwargs([("A", 2, 1), ("B", 1, 1)]), None, 0, kv)
    assert sync.pending("A") == 0 and sync.dropped_tokens == 1 and not kv.passes


def test_more_requests_than_buffer_rows_are_not_deferred():
    sync, kv = _sync(max_reqs=2), FakeDrafterKV()
    assert sync.step(0, ["A", "B"], _step_kwargs([("A", 1, 1), ("B", 1, 1)]), None, 0, kv)
    # C would need a third row: the step runs its pass, after flushing A and B.
    assert not sync.step(0, ["A", "B", "C"],
                         _step_kwargs([("A", 2, 1), ("B", 2, 1), ("C", 1, 1)]), None, 0, kv)
    assert len(kv.passes) == 1 and sync.pending("A") == 0


@pytest.mark.parametrize("slack", [0, 2])
def test_prefix_caching_flushes_before_a_block_fills(slack):
    sync, kv = _sync(depth=8, block_size=4, flush_before_block_fills=True), FakeDrafterKV()
    deferred = []
    for pos in range(1, 10):
        kwargs = _step_kwargs([("A", pos, 1)])
        seq = kwargs["common_attn_metadata"]._seq_lens_cpu.numpy() + slack  # host's bound
        deferred.append(sync.step(0, ["A"], kwargs, seq, slack, kv))
        if not deferred[-1]:
            kv(**kwargs)
    # Position p fills its block when (p + 1) % 4 == 0; with slack the host cannot tell which
    # of slack+1 positions it is, and must pass if any of them fills one.
    fills = [any((p + d + 1) % 4 == 0 for d in range(slack + 1)) for p in range(1, 10)]
    assert deferred == [not f for f in fills]
    # Every full block's slots are written by the step that filled it.
    assert {_slot("A", p) for p in range(1, 8)} <= set(kv.kv)
    # Without a host bound the step is not deferred.
    assert not sync.step(0, ["A"], _step_kwargs([("A", 10, 1)]), None, 0, kv)


def test_buffers_are_sized_by_depth_and_width():
    sync = _sync(depth=8, max_reqs=16)
    assert sync.hidden.shape == (16 * 8, WIDTH)
    assert sync.nbytes() == 16 * 8 * (4 + 8 + 8 + 4 * WIDTH)
    assert np.all(sync._count == 0)


def test_tail_blocks_cover_every_position_that_may_be_unwritten():
    from specdec_plugin.spec_decode.deferred_sync import tail_block_ids

    groups = ([10, 11, 12, 13], [20, 21, 22, 23])
    # 50 tokens computed, blocks of 16: positions 38..49 lie in blocks 2 and 3.
    assert tail_block_ids(groups, 50, 16, 12) == {12, 13, 22, 23}
    assert tail_block_ids(groups, 50, 16, 2) == {13, 23}
    assert tail_block_ids(groups, 48, 16, 1) == {12, 22}  # position 47 ends block 2
    assert tail_block_ids(groups, 5, 16, 12) == {10, 20}
    assert tail_block_ids(groups, 0, 16, 12) == set()
    for n in range(1, 64):
        for window in (1, 5, 13):
            blocks = tail_block_ids(([*range(4)],), n, 16, window)
            assert {p // 16 for p in range(max(n - window, 0), n)} == blocks


def test_uncache_window_only_with_prefix_caching_and_a_drafter_model(monkeypatch):
    from types import SimpleNamespace

    from specdec_plugin.spec_decode.deferred_sync import DEFAULT_DEPTH, uncache_window

    def config(method="eagle3", k=3, prefix=True):
        spec = SimpleNamespace(use_eagle=lambda: method in ("eagle", "eagle3", "mtp"),
                               uses_draft_model=lambda: method == "draft_model",
                               num_speculative_tokens=k)
        return SimpleNamespace(speculative_config=spec,
                               cache_config=SimpleNamespace(enable_prefix_caching=prefix))

    monkeypatch.setenv("SPECDEC_DEFER_DRAFTER_SYNC", "1")  # what the CPU and CUDA layers set
    assert uncache_window(config()) == DEFAULT_DEPTH + 3 + 1
    assert uncache_window(config(k=10)) == 11 + 10 + 1
    assert uncache_window(config(prefix=False)) is None
    assert uncache_window(config(method="draft_model")) == DEFAULT_DEPTH + 3 + 1
    assert uncache_window(config(method="ngram")) is None
    monkeypatch.setenv("SPECDEC_DEFER_DRAFTER_SYNC", "0")
    assert uncache_window(config()) is None
    monkeypatch.delenv("SPECDEC_DEFER_DRAFTER_SYNC")  # unset: off (NPUs) unless a layer sets it
    assert uncache_window(config()) is None


def test_the_vllm_seams_the_deferral_relies_on():
    """The runner, scheduler and proposer methods the deferral hooks, as vLLM 0.26 defines
    and uses them (an upgrade that moves them fails here, not silently while serving)."""
    from tests.test_patch_catalog import _params, _source

    runner = _source("v1/worker/gpu_model_runner.py")
    assert _params("v1/worker/gpu_model_runner.py", "_update_states", cls="GPUModelRunner") == [
        "self", "scheduler_output"]
    assert _params("v1/worker/gpu_model_runner.py", "_input_fits_in_drafter",
                   cls="GPUModelRunner") == ["self", "common_attn_metadata"]
    # One check per step decides whether the drafter runs at all.
    assert runner.count("self._input_fits_in_drafter(") == 1
    # The proposer returns before drafting when k = 0, after its first pass (what we skip).
    assert "if self.num_speculative_tokens == 0:" in _source("v1/spec_decode/llm_base_proposer.py")
    sched = _source("v1/core/sched/scheduler.py")
    assert _params("v1/core/sched/scheduler.py", "_free_request_blocks", cls="Scheduler") == [
        "self", "request"]
    # Both ways a running request's blocks are freed go through it.
    assert sched.count("self._free_request_blocks(request)") >= 2
    assert _params("v1/core/block_pool.py", "evict_blocks", cls="BlockPool") == [
        "self", "block_ids"]
    assert _params("v1/core/kv_cache_manager.py", "get_block_ids", cls="KVCacheManager") == [
        "self", "request_id"]
