"""The drafter-graph plumbing (spec_decode/drafter_graphs.py) on the host.

A graph records the addresses of the tensors ``propose`` read while it was recorded. So a
recorded call must read our static buffers and nothing of the live call, each buffer in the
role of the live tensor it copies. The replay itself needs a GPU: tests/gpu checks it against
eager drafting. Inputs are fresh random values on every run.
"""
from __future__ import annotations

import pytest
import torch
from vllm.v1.attention.backend import CommonAttentionMetadata

from specdec_plugin.spec_decode.drafter_graphs import _ProposeCall


def _live_call(with_optional: bool) -> _ProposeCall:
    batch, k, hidden, width = 3, 2, 8, 5
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
        positions=torch.randint(0, 60, (num_tokens,)),
    )
    return _ProposeCall(dict(
        num_speculative_tokens=k,
        target_token_ids=torch.randint(0, 1000, (num_tokens,), dtype=torch.int32),
        target_positions=torch.randint(0, 60, (num_tokens,)),
        target_hidden_states=torch.randn(num_tokens, hidden),
        next_token_ids=torch.randint(0, 1000, (batch,), dtype=torch.int32),
        token_indices_to_sample=(torch.randint(0, num_tokens, (batch,), dtype=torch.int32)
                                 if with_optional else None),
        common_attn_metadata=cad, sampling_metadata=object(), mm_embed_inputs=None,
        num_rejected_tokens_gpu=(torch.randint(0, k + 1, (batch,), dtype=torch.int32)
                                 if with_optional else None),
        slot_mappings=None))


def _tensors_reachable(kwargs: dict) -> list[torch.Tensor]:
    cad = kwargs["common_attn_metadata"]
    values = list(kwargs.values()) + [getattr(cad, f) for f in cad.__dataclass_fields__]
    return [v for v in values if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("with_optional", [True, False])
def test_recorded_call_reads_static_buffers_in_the_same_roles(with_optional):
    call = _live_call(with_optional)
    live = call.tensors()
    static = [None if t is None else torch.empty_like(t) for t in live]
    recorded = call.on(static, max_model_len=4096)

    roles = _ProposeCall(recorded).tensors()
    assert [r is s for r, s in zip(roles, static)] == [True] * len(static)
    reachable = {id(t) for t in _tensors_reachable(recorded)}
    assert not reachable & {id(t) for t in live if t is not None}, "a live tensor leaked in"


def test_recorded_call_plans_for_every_length_and_leaves_the_live_call_alone():
    call = _live_call(True)
    cad = call.kwargs["common_attn_metadata"]
    before = {name: getattr(cad, name).clone() for name in
              ("query_start_loc_cpu", "_seq_lens_cpu", "seq_lens")}
    static = [None if t is None else torch.empty_like(t) for t in call.tensors()]
    recorded = call.on(static, max_model_len=4096)
    new_cad = recorded["common_attn_metadata"]

    assert new_cad.max_seq_len == 4096  # launch sizes must suit any later context length
    assert new_cad.positions is None  # not read by propose: no stale address recorded
    # propose changes the host shadows in place: the recorded call must own copies of them.
    new_cad._seq_lens_cpu += 1
    new_cad.query_start_loc_cpu += 1
    for name, value in before.items():
        assert torch.equal(getattr(cad, name), value), f"{name} of the live call changed"
    assert cad.max_seq_len == int(cad.seq_lens.max())
    assert new_cad.num_actual_tokens == cad.num_actual_tokens
    assert new_cad.max_query_len == cad.max_query_len


def test_runner_installs_our_drafters(monkeypatch):
    """The runner's seam (spec_decode/runner_drafters.py): vLLM's EAGLE / draft-model drafter is
    replaced by ours, built with the same arguments; other drafters are left alone."""
    from types import SimpleNamespace

    from specdec_plugin.spec_decode import runner_drafters
    from specdec_plugin.spec_decode.drafter_graphs import DrafterGraphs

    assert len(runner_drafters.DRAFTERS) == 2
    for vllms, ours in runner_drafters.DRAFTERS.items():
        assert ours is not vllms and issubclass(ours, vllms) and issubclass(ours, DrafterGraphs)
        # Our propose and vLLM's padding hook must come first in the method order.
        assert ours.propose is DrafterGraphs.propose
        built = []
        monkeypatch.setattr(ours, "__init__", lambda self, **kw: built.append(kw))
        runner = SimpleNamespace(drafter=vllms.__new__(vllms), vllm_config="cfg", device="dev")
        runner_drafters.install_drafter(runner)
        assert type(runner.drafter) is ours
        assert built == [{"vllm_config": "cfg", "device": "dev", "runner": runner}]
        # vLLM's own subclasses (Gemma4Proposer is an EagleProposer) keep their class.
        sub = type("VllmSubclass", (vllms,), {})
        runner.drafter = sub.__new__(sub)
        runner_drafters.install_drafter(runner)
        assert type(runner.drafter) is sub and len(built) == 1


def test_p7_rebinds_ngram_and_suffix_names(monkeypatch):
    import importlib

    from specdec_plugin.patches import proposers

    # Recording each name with monkeypatch first makes the test undo what apply() rebinds.
    for (module, name) in proposers.PROPOSERS:
        mod = importlib.import_module(module)
        monkeypatch.setattr(mod, name, getattr(mod, name))
    proposers.apply()
    for (module, name), ours in proposers.PROPOSERS.items():
        bound = getattr(importlib.import_module(module), name)
        assert bound is proposers._load(ours) and bound.__module__.startswith("specdec_plugin")


def test_drafter_graphs_take_the_device_layer_from_their_runner(monkeypatch):
    """The device layer is passed down by the runner that builds the drafter, not read from the
    global platform (data flows one way)."""
    from types import SimpleNamespace

    from specdec_plugin.spec_decode.drafter_graphs import DrafterGraphs

    seen = []
    monkeypatch.setattr(DrafterGraphs, "_device_for_graphs",
                        lambda self, layer: seen.append(layer))
    # The stand-in below has none of vLLM's proposer state that the deferral reads.
    monkeypatch.setenv("SPECDEC_DEFER_DRAFTER_SYNC", "0")

    class VllmDrafter:
        def __init__(self, vllm_config, device, runner=None):
            pass

    class Ours(DrafterGraphs, VllmDrafter):
        pass

    layer = object()
    Ours(vllm_config=None, device=None, runner=SimpleNamespace(device_layer=layer))
    assert seen == [layer]
