"""Padded drafter graphs (spec_decode/drafter_padding.py, drafter_graphs.py) on the host: a
fake device layer "records" a graph by keeping the function, and a replay runs it again on the
shared input buffers, so what vLLM's ``propose`` reads after padding is checked for real."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.v1.attention.backend import CommonAttentionMetadata

from specdec_plugin.spec_decode import drafter_graphs
from specdec_plugin.spec_decode.drafter_graphs import DrafterGraphs
from specdec_plugin.spec_decode.drafter_padding import request_buckets
from specdec_plugin.spec_decode.graph_memory import GraphMemoryBudget

K, HIDDEN, BLOCK, MAX_LEN = 3, 8, 16, 512


def test_request_buckets_pad_at_most_half_past_two():
    assert request_buckets(1) == [1]
    assert request_buckets(8) == [1, 2, 3, 4, 6, 8]
    assert request_buckets(256)[-4:] == [96, 128, 192, 256]
    assert request_buckets(100)[-2:] == [96, 100]
    for n in range(3, 300):
        b = request_buckets(300)
        assert n <= next(x for x in b if x >= n) <= 1.5 * n


class _GraphDevice:
    kernel_providers = ("torch",)

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
        return SimpleNamespace(replay=lambda: out.copy_(fn())), out


class _VllmDrafter:
    """vLLM's proposer as far as DrafterGraphs uses it. Its drafts are a function of what it
    reads (each request's sampled token, its last real token and its sequence length), so a
    padding mistake changes them."""

    def __init__(self, vllm_config=None, device=None, runner=None):
        self.vllm_config = vllm_config
        self.speculative_config = vllm_config.speculative_config
        self.draft_model_config = self.speculative_config.draft_model_config
        self.method, self.eagle3_use_aux_hidden_state = "eagle", True
        self.hidden_size, self.dtype, self.device = HIDDEN, torch.float32, torch.device("cpu")
        self.max_model_len, self.max_batch_size, self.max_num_tokens = MAX_LEN, 8, 64
        self.block_size, self.needs_extra_input_slots = BLOCK, False
        self.parallel_drafting = self.uses_mrope = self._share_mtp_indices = False
        self.uses_xdrope_dim, self.eplb_state = 0, None
        self._enable_probabilistic_draft_probs = False
        self.calls = []

    def propose(self, **kw):
        self.calls.append(kw)
        cad = kw["common_attn_metadata"]
        tis = kw["token_indices_to_sample"]
        if tis is None:
            tis = cad.query_start_loc[1:] - 1
        rejected = kw["num_rejected_tokens_gpu"]
        seq = cad.seq_lens - (0 if rejected is None else rejected)
        base = kw["next_token_ids"].long() * 1000 + kw["target_token_ids"][tis.long()].long() + seq
        return base[:, None] + torch.arange(kw["num_speculative_tokens"])


class _Drafter(DrafterGraphs, _VllmDrafter):
    pass


@pytest.fixture
def drafter(monkeypatch):
    device = _GraphDevice()
    monkeypatch.setattr(DrafterGraphs, "_device_for_graphs", lambda self, layer: device)
    monkeypatch.setattr(drafter_graphs, "adaptive_enabled", lambda config: True)
    target = SimpleNamespace(get_hidden_size=lambda: HIDDEN, enforce_eager=False)
    spec = SimpleNamespace(num_speculative_tokens=K, draft_model_config=SimpleNamespace(
        hf_config=SimpleNamespace()))
    return _Drafter(vllm_config=SimpleNamespace(model_config=target, speculative_config=spec),
                    device="cpu", runner=None)


def _call(lens: list[int], k: int, seed: int, with_rejected: bool = True, max_seq: int = 200):
    g = torch.Generator().manual_seed(seed)
    qsl = torch.zeros(len(lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(lens), 0)
    total, batch = int(qsl[-1]), len(lens)
    seq_lens = torch.randint(8, max_seq, (batch,), generator=g, dtype=torch.int32)
    rejected = torch.tensor([int(torch.randint(0, n, (1,), generator=g)) for n in lens],
                            dtype=torch.int32)
    cad = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq_lens,
        num_reqs=batch, num_actual_tokens=total, max_query_len=max(lens),
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=torch.randint(1, 99, (batch, MAX_LEN // BLOCK), generator=g, dtype=torch.int32),
        slot_mapping=torch.randint(0, 1600, (total,), generator=g))
    return dict(
        num_speculative_tokens=k,
        target_token_ids=torch.randint(1, 1000, (total,), generator=g, dtype=torch.int32),
        target_positions=torch.randint(1, 60, (total,), generator=g),
        target_hidden_states=torch.rand(total, HIDDEN, generator=g) + 1,
        next_token_ids=torch.randint(1, 1000, (batch,), generator=g, dtype=torch.int32),
        token_indices_to_sample=(qsl[1:] - 1 - rejected) if with_rejected else None,
        common_attn_metadata=cad, sampling_metadata=SimpleNamespace(all_greedy=True),
        num_rejected_tokens_gpu=rejected if with_rejected else None)


def _eager(kw):
    return _VllmDrafter.propose(SimpleNamespace(calls=[]), **kw)


def test_startup_records_every_bucket_and_length_then_serving_records_nothing(drafter):
    drafter.prerecord_graphs()
    assert drafter._graph_device.captured == len(request_buckets(8)) * (K + 1)
    for seed, lens in enumerate([[4, 4, 4], [1, 4, 2, 3, 1], [1], [2] * 8, [4] * 7]):
        for k in range(K + 1):
            kw = _call(lens, k, seed * 10 + k, with_rejected=seed % 2 == 0)
            want = _eager(kw)
            got = drafter.propose(**kw)
            assert torch.equal(got, want), (lens, k)
    assert drafter._graph_device.captured == len(request_buckets(8)) * (K + 1)
    # What vLLM's propose read on the last replay: 8 requests of 1+K tokens.
    last = drafter.calls[-1]
    assert last["target_token_ids"].shape == (8 * (1 + K),)
    assert last["common_attn_metadata"].max_query_len == 1 + K


def test_without_startup_a_bucket_is_recorded_once_while_serving(drafter):
    for lens in ([2, 3, 1], [4, 1, 1, 1], [1, 1, 1]):
        drafter.propose(**_call(lens, K, 7))
    assert drafter._graph_device.captured == 2  # buckets 3 and 4
    assert set(drafter._draft_graphs) == {("padded", K, 3), ("padded", K, 4)}


def test_a_padded_graph_that_fails_at_start_is_served_without_it(drafter, monkeypatch, caplog):
    """The rule tests/gpu/test_serve_gpu.py checks under load on a GPU: a padded graph whose
    recording fails at start-up (an op that cannot be recorded) warns once and is not tried
    again; its steps draft exactly as eager drafting does (through an exact-shape graph
    recorded while serving), and the other buckets still replay their padded graphs."""
    device = drafter._graph_device
    real_capture = device.capture_graph
    failing = {"key": ("padded", K, 4), "armed": True}
    real_capture_keyed = DrafterGraphs._capture

    def refuse(fn, pool, stream):
        raise RuntimeError("forced: cannot be recorded")

    def capture(self, key, run, *args, **kwargs):
        if failing["armed"] and key == failing["key"]:
            failing["armed"] = False
            monkeypatch.setattr(device, "capture_graph", refuse)
            try:
                return real_capture_keyed(self, key, run, *args, **kwargs)
            finally:
                monkeypatch.setattr(device, "capture_graph", real_capture)
        return real_capture_keyed(self, key, run, *args, **kwargs)

    monkeypatch.setattr(DrafterGraphs, "_capture", capture)
    drafter.prerecord_graphs()
    assert drafter._draft_graphs[failing["key"]] is None
    assert [r for r in caplog.records if "not recorded" in r.getMessage()], "no warning"
    recorded_at_start = device.captured
    paths = []
    for seed, lens in enumerate([[4, 4, 4, 4], [1, 4, 2, 3], [4, 4, 4, 4], [2] * 8, [1]]):
        kw = _call(lens, K, 50 + seed)
        assert torch.equal(drafter.propose(**kw), _eager(kw)), lens
        paths.append(drafter._last_path)
    # Bucket 4 never replays the failed graph; buckets 8 and 1 still replay theirs.
    assert paths[0] != "replay_padded" and paths[1] != "replay_padded"
    assert paths[3] == paths[4] == "replay_padded"
    # The 4-request shape was recorded once as an exact-shape graph and replayed after that.
    assert paths[2] == "replay"
    assert drafter._draft_graphs[failing["key"]] is None  # not retried
    assert len([r for r in caplog.records if "not recorded" in r.getMessage()]) == 1
    assert device.captured == recorded_at_start + 2  # the two 4-request exact shapes


def test_the_start_up_timer_replays_each_lengths_padded_graph(drafter, monkeypatch):
    """The cost table's drafting timer (SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST, adaptive/measure.py)
    replays the graph a step of k drafts at each padded size replays, outside inference mode
    as the table is timed, on buffers made inside it as the runner records them."""
    with torch.inference_mode():
        drafter.prerecord_graphs()
    run, buckets = drafter.padded_draft_timer()
    assert buckets == request_buckets(8)
    for padded in buckets:
        for k in range(1, K + 1):
            before = len(drafter.calls)
            run(padded, k)
            last = drafter.calls[-1]
            assert len(drafter.calls) == before + 1
            assert last["num_speculative_tokens"] == k
            assert last["target_token_ids"].shape == (padded * (1 + K),)
    with pytest.raises(LookupError):
        run(5, 1)  # no bucket of 5
    monkeypatch.setenv("SPECDEC_DRAFTER_PADDING", "0")
    drafter._padded_inputs = None
    assert drafter.padded_draft_timer() is None


def test_steps_near_max_model_len_are_not_padded(drafter):
    kw = _call([4, 4], K, 3, max_seq=MAX_LEN - 2)
    kw["common_attn_metadata"].max_seq_len = MAX_LEN - K  # the fillers would pass the table
    got = drafter.propose(**kw)
    assert torch.equal(got, _eager(kw))
    assert not any(key[0] == "padded" for key in drafter._draft_graphs)


def test_padding_can_be_switched_off(drafter, monkeypatch):
    monkeypatch.setenv("SPECDEC_DRAFTER_PADDING", "0")
    drafter.prerecord_graphs()
    assert drafter._graph_device.captured == 0
    drafter.propose(**_call([4, 4], K, 3))
    assert list(drafter._draft_graphs) == [(K, 4, 8, list(drafter._draft_graphs)[0][3])]


def test_static_k_records_only_k(drafter, monkeypatch):
    monkeypatch.setattr(drafter_graphs, "adaptive_enabled", lambda config: False)
    drafter.prerecord_graphs()
    assert {key[1] for key in drafter._draft_graphs} == {K}


@pytest.mark.parametrize("fits", [True, False])
def test_shared_buffers_are_charged_once_even_when_recordings_are_refused(drafter, monkeypatch, fits):
    """The padded buffers exist once recording starts, so the budget holds them from then on:
    with room for them alone every graph records (none charges them again); with no room, no
    graph records (before: the first was refused and the rest went through uncharged)."""
    monkeypatch.setattr(DrafterGraphs, "_reserved_bytes", staticmethod(lambda: 0))
    buffers = drafter._padding().nbytes()
    drafter._graph_budget = GraphMemoryBudget(0, buffers if fits else buffers - 1)
    drafter.prerecord_graphs()
    recorded = len(request_buckets(8)) * (K + 1) if fits else 0
    assert drafter._graph_device.captured == recorded
    assert drafter._graph_budget.static_used == buffers
    assert drafter._graph_budget.recordings == recorded


def _inserted_slots(drafter, slots: int, hidden_to_model: bool) -> None:
    drafter.needs_extra_input_slots = True
    drafter.pass_hidden_states_to_model = hidden_to_model
    drafter.extra_slots_per_request = slots
    drafter.net_num_new_slots_per_request = slots - int(hidden_to_model)


def test_the_draft_model_layout_is_padded_one_position_lower_within_its_buffers(drafter):
    # vLLM's draft model inserts the next token after each request's tokens (one slot, no
    # hidden states): padded, with filler requests one position lower, so that the inserted
    # slot stays inside max_model_len. Its pass has 1+K+1 tokens per request, so the buckets
    # stop at the requests the drafter's token buffers hold.
    _inserted_slots(drafter, slots=1, hidden_to_model=False)
    drafter.max_num_tokens = 6 * (K + 2) + 1
    inputs = drafter._padding()
    assert inputs is not None and inputs.fake_position == MAX_LEN - 2
    assert inputs.buckets[-1] == 6 < drafter.max_batch_size


def test_eagle_filler_requests_sit_at_the_last_position(drafter):
    assert drafter._padding().fake_position == MAX_LEN - 1


def test_other_inserted_slot_layouts_are_not_padded(drafter):
    # Parallel drafting inserts K slots and passes hidden states: not a layout the padding maps.
    _inserted_slots(drafter, slots=K, hidden_to_model=True)
    assert drafter._padding() is None
