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


def test_budget_allows_the_first_recording_then_holds_its_limit():
    budget = GraphMemoryBudget(100 * MiB)
    assert budget.allows(500 * MiB)  # sized for the largest: the first always goes
    budget.charge(60 * MiB, static_bytes=10 * MiB)
    assert budget.used == 60 * MiB and budget.largest_growth == 50 * MiB
    assert not budget.allows(1)  # 60 + 50 of growth the next one may cause > 100 - 1
    small = GraphMemoryBudget(200 * MiB)
    small.charge(60 * MiB, 10 * MiB)
    assert small.allows(10 * MiB) and not small.allows(91 * MiB)


# ---- the drafter: reservation and enforcement ----

class _Allocator:
    reserved = 0


class _FakeGraphDevice:
    """A device layer's graph hooks: a "graph" re-runs nothing; recording costs 40 MiB."""

    def __init__(self):
        self.captured = 0

    def new_graph_pool(self):
        return None

    def new_stream(self):
        return None

    def run_on_stream(self, fn, stream):
        return fn()

    def capture_graph(self, fn, pool, stream):
        out = fn()
        self.captured += 1
        _Allocator.reserved += 40 * MiB
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
    limit = drafter.reserve_graph_memory(lambda fn: (fn(), 30 * MiB)[1])
    shape = largest_decode_shape(256, 2048, K)
    assert drafter.dummy_runs == [(shape.num_tokens, False)]
    working = 30 * MiB + graph_memory.logits_bytes(shape.num_reqs, 1000)
    # EAGLE-3: three auxiliary target layers of width 8, side by side (24 = HIDDEN).
    static = static_input_bytes(shape, 24, torch.bfloat16, 1024 // 16)
    assert limit == graph_memory.reservation_bytes(working, static)
    assert drafter._graph_budget.limit == limit


def test_no_reservation_where_no_graphs_are_recorded(monkeypatch):
    monkeypatch.setattr(DrafterGraphs, "_device_for_graphs", lambda self, layer: None)
    plain = _Drafter(vllm_config=_config(), device="cpu", runner=None)
    assert plain.reserve_graph_memory(lambda fn: 1 / 0) == 0
    assert plain._graph_budget is None


def test_recordings_past_the_budget_draft_eagerly_with_one_warning(drafter, caplog):
    drafter._graph_budget = GraphMemoryBudget(60 * MiB)
    first = _call_kwargs(4)
    drafter.propose(**first)  # recorded: warm-up + capture run vLLM's propose twice
    assert drafter._graph_device.captured == 1 and drafter.eager == 2
    assert drafter._graph_budget.used >= 40 * MiB

    with caplog.at_level(logging.WARNING):
        drafter.propose(**_call_kwargs(2))  # 40 used + 40 growth > 60: refused
        drafter.propose(**_call_kwargs(3))
        drafter.propose(**_call_kwargs(2))
    assert drafter._graph_device.captured == 1
    assert drafter.eager == 2 + 3  # each refused step drafted eagerly
    warnings = [r for r in caplog.records if "held back for them" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]

    drafter.propose(**_call_kwargs(4))  # the recorded shape still replays
    assert drafter.eager == 5 and drafter._graph_device.captured == 1


def test_without_a_budget_every_shape_is_recorded(drafter):
    for batch in (1, 2, 3, 4, 5):
        drafter.propose(**_call_kwargs(batch))
    assert drafter._graph_device.captured == 5
