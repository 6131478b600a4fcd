"""The drafter graphs' memory reservation (spec_decode/graph_memory.py) and its enforcement
(spec_decode/drafter_graphs.py), on the host: a fake device layer records "graphs" by running
``propose`` once, and a fake allocator counter stands for the device's reserved bytes."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from vllm.v1.attention.backend import CommonAttentionMetadata

from specdec_plugin.spec_decode import graph_memory
from specdec_plugin.spec_decode.drafter_graphs import DrafterGraphs, _ProposeCall
from specdec_plugin.spec_decode.graph_memory import (
    DecodeShape,
    GraphMemoryBudget,
    largest_decode_shape,
    static_input_bytes,
    tensor_bytes,
)

MiB = 1 << 20
K = 3
HIDDEN = 24


def _call_kwargs(batch: int, k: int = K, hidden: int = HIDDEN, width: int = 64) -> dict:
    num_tokens = batch * (1 + k)
    query_start_loc = torch.arange(batch + 1, dtype=torch.int32) * (1 + k)
    seq_lens = torch.randint(1 + k, 60, (batch,), dtype=torch.int32)
    cad = CommonAttentionMetadata(
        query_start_loc=query_start_loc, query_start_loc_cpu=query_start_loc.clone(),
        seq_lens=seq_lens, _seq_lens_cpu=seq_lens.clone(),
        num_reqs=batch, num_actual_tokens=num_tokens, max_query_len=1 + k,
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=torch.randint(0, 100, (batch, width), dtype=torch.int32),
        slot_mapping=torch.randint(0, 1600, (num_tokens,)),
    )
    return dict(
        num_speculative_tokens=k,
        target_token_ids=torch.randint(0, 1000, (num_tokens,), dtype=torch.int32),
        target_positions=torch.randint(0, 60, (num_tokens,)),
        target_hidden_states=torch.randn(num_tokens, hidden),
        next_token_ids=torch.randint(0, 1000, (batch,), dtype=torch.int32),
        token_indices_to_sample=torch.randint(0, num_tokens, (batch,), dtype=torch.int32),
        common_attn_metadata=cad, sampling_metadata=SimpleNamespace(all_greedy=True),
        num_rejected_tokens_gpu=torch.zeros(batch, dtype=torch.int32))


# ---- the arithmetic ----

def test_largest_decode_shape_is_full_queries_within_both_limits():
    assert largest_decode_shape(256, 2048, 3) == DecodeShape(256, 1024)
    assert largest_decode_shape(1024, 2048, 3) == DecodeShape(512, 2048)
    assert largest_decode_shape(8, 3, 3) == DecodeShape(1, 4)  # never below one request


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_static_input_estimate_covers_a_real_call_and_is_not_wild(batch):
    kwargs = _call_kwargs(batch)
    real = tensor_bytes(_ProposeCall(kwargs).tensors())
    shape = DecodeShape(batch, batch * (1 + K))
    estimate = static_input_bytes(shape, HIDDEN, torch.float32, 64)
    assert real <= estimate <= 2 * real


def test_budget_lets_the_pool_grow_and_holds_the_sum_to_the_reservation():
    budget = GraphMemoryBudget(working_limit=100 * MiB, static_limit=30 * MiB)
    assert budget.limit == 130 * MiB
    assert budget.allows(130 * MiB) and not budget.allows(131 * MiB)
    budget.charge(90 * MiB, static_bytes=10 * MiB)  # the first: pool and stream cache grew
    assert (budget.working_used, budget.static_used) == (80 * MiB, 10 * MiB)
    # Later recordings reuse the pool (the allocator may even reuse cached blocks for the
    # buffers): only their buffers count.
    budget.charge(4 * MiB, static_bytes=10 * MiB)
    assert (budget.working_used, budget.static_used) == (80 * MiB, 20 * MiB)
    # The pool past its part (the estimate fell short) may use what the buffers left ...
    budget.charge(25 * MiB, static_bytes=0)
    assert budget.working_used == 105 * MiB and budget.allows(5 * MiB)
    # ... and no more than that.
    assert not budget.allows(6 * MiB)
    budget.charge(6 * MiB, static_bytes=0)
    assert not budget.allows(0)


def test_reservation_is_three_working_sets_and_eight_buffer_sets():
    big = graph_memory.MIN_WORKING_SET + 50
    budget = GraphMemoryBudget.for_largest_shape(working_set=big, static_bytes=3)
    assert (budget.working_limit, budget.static_limit) == (3 * big, 24)


def test_a_small_working_set_counts_as_the_allocators_floor():
    # A small drafter's pool still grows by whole allocator segments (graph_memory.py).
    budget = GraphMemoryBudget.for_largest_shape(working_set=24 * MiB, static_bytes=3)
    assert budget.working_limit == 3 * graph_memory.MIN_WORKING_SET > 3 * 24 * MiB


# ---- the drafter: reservation and enforcement ----

class _Allocator:
    reserved = 0


class _FakeGraphDevice:
    """A device layer's graph hooks: a "graph" replays nothing. The first recording grows the
    allocator by 40 MiB (pool and stream cache), later ones by ``later`` each."""

    def __init__(self):
        self.captured = 0
        self.later = 0

    def new_graph_pool(self):
        return None

    def new_stream(self):
        return None

    def run_on_stream(self, fn, stream):
        return fn()

    def capture_graph(self, fn, pool, stream):
        out = fn()
        self.captured += 1
        _Allocator.reserved += 40 * MiB if self.captured == 1 else self.later
        return SimpleNamespace(replay=lambda: None), out


class _VllmDrafter:
    """What DrafterGraphs needs of vLLM's SpecDecodeBaseProposer."""

    def __init__(self, vllm_config=None, device=None, runner=None):
        self.vllm_config = vllm_config
        self.speculative_config = vllm_config.speculative_config
        self.draft_model_config = self.speculative_config.draft_model_config
        self.method = "eagle3"
        self.eagle3_use_aux_hidden_state = True
        self.hidden_size = HIDDEN
        self.dtype = torch.bfloat16
        self.max_model_len = 1024
        self.max_batch_size, self.max_num_tokens = 256, 2048
        self.parallel_drafting = self.uses_mrope = self._share_mtp_indices = False
        self.uses_xdrope_dim, self.eplb_state = 0, None
        self._enable_probabilistic_draft_probs = False
        # The exact-shape graphs are what these tests measure: an inserted-slot layout that
        # padding does not map (parallel drafting's); padded ones: tests/test_drafter_padding.py.
        self.needs_extra_input_slots = self.pass_hidden_states_to_model = True
        self.net_num_new_slots_per_request = self.extra_slots_per_request = K
        self.eager = 0
        self.dummy_runs = []

    def propose(self, **kwargs):
        self.eager += 1
        batch = kwargs["next_token_ids"].shape[0]
        return torch.zeros(batch, kwargs["num_speculative_tokens"], dtype=torch.int64)

    def dummy_run(self, num_tokens, use_cudagraphs=True):
        self.dummy_runs.append((num_tokens, use_cudagraphs))


class _Drafter(DrafterGraphs, _VllmDrafter):
    pass


def _config():
    target = SimpleNamespace(get_hidden_size=lambda: 8, enforce_eager=False)
    draft = SimpleNamespace(get_vocab_size=lambda: 1000, hf_config=SimpleNamespace())
    spec = SimpleNamespace(num_speculative_tokens=K, draft_model_config=draft)
    return SimpleNamespace(model_config=target, speculative_config=spec,
                           cache_config=SimpleNamespace(block_size=16))


@pytest.fixture
def drafter(monkeypatch):
    device = _FakeGraphDevice()
    monkeypatch.setattr(DrafterGraphs, "_device_for_graphs", lambda self, layer: device)
    monkeypatch.setattr(DrafterGraphs, "_reserved_bytes", staticmethod(lambda: _Allocator.reserved))
    _Allocator.reserved = 0
    return _Drafter(vllm_config=_config(), device="cpu", runner=None)


def test_reservation_measures_the_largest_shape_and_installs_the_budget(drafter):
    limit = drafter.reserve_graph_memory(lambda fn: (fn(), 90 * MiB)[1])
    shape = largest_decode_shape(256, 2048, K)
    assert drafter.dummy_runs == [(shape.num_tokens, False)]
    working = 90 * MiB + graph_memory.logits_bytes(shape.num_reqs, 1000)
    assert working > graph_memory.MIN_WORKING_SET
    # EAGLE-3: three auxiliary target layers of width 8, side by side (24 = HIDDEN).
    static = static_input_bytes(shape, 24, torch.bfloat16, 1024 // 16)
    assert limit == 3 * working + 8 * static
    assert drafter._graph_budget.limit == limit


def test_no_reservation_where_no_graphs_are_recorded(monkeypatch):
    monkeypatch.setattr(DrafterGraphs, "_device_for_graphs", lambda self, layer: None)
    plain = _Drafter(vllm_config=_config(), device="cpu", runner=None)
    assert plain.reserve_graph_memory(lambda fn: 1 / 0) == 0
    assert plain._graph_budget is None


def _static(batch: int) -> int:
    return tensor_bytes(_ProposeCall(_call_kwargs(batch)).tensors())


def test_recordings_past_the_reservation_draft_eagerly_with_one_warning(drafter, caplog):
    # Room for the pool (40 MiB) and the buffers of batches 4 and 2, not 3 more.
    drafter._graph_budget = GraphMemoryBudget(40 * MiB, _static(4) + _static(2))
    drafter.propose(**_call_kwargs(4))  # recorded: warm-up + capture run vLLM's propose twice
    drafter.propose(**_call_kwargs(2))
    assert drafter._graph_device.captured == 2 and drafter.eager == 4
    # The buffers are made before the recording, so the allocator's growth is the pool's.
    assert drafter._graph_budget.working_used == 40 * MiB

    with caplog.at_level(logging.WARNING):
        drafter.propose(**_call_kwargs(3))  # its buffers do not fit: eager
        drafter.propose(**_call_kwargs(3))  # not retried
        drafter.propose(**_call_kwargs(5))
    assert drafter._graph_device.captured == 2
    assert drafter.eager == 4 + 3  # each refused step drafted eagerly
    warnings = [r for r in caplog.records if "held back for them" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]

    drafter.propose(**_call_kwargs(4))  # the recorded shapes still replay
    assert drafter.eager == 7 and drafter._graph_device.captured == 2


def test_a_pool_past_the_reservation_stops_recording(drafter):
    drafter._graph_budget = GraphMemoryBudget(30 * MiB, 5 * MiB)
    drafter.propose(**_call_kwargs(4))  # grows 40 MiB: past the 30 MiB estimated
    drafter.propose(**_call_kwargs(2))
    assert drafter._graph_device.captured == 1


def test_without_a_budget_every_shape_is_recorded(drafter):
    for batch in (1, 2, 3, 4, 5):
        drafter.propose(**_call_kwargs(batch))
    assert drafter._graph_device.captured == 5
