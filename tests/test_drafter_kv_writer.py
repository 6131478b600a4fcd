"""KV-only deferred flushes (spec_decode/drafter_kv_writer.py), without an engine.

The deferral's scripted run of tests/test_deferred_sync.py, with a writer in place of the
flush's drafter pass: the writer must be given, for every kept token, the input id vLLM's
first pass would have used (its successor), its position, hidden states and slot, so that the
fake KV equals that of a run passing every step. The engine tests
(tests/test_deferred_sync_engine.py) check the real writer's drafts against deferral off."""
from __future__ import annotations

from tests.test_deferred_sync import SCRIPT, FakeDrafterKV, _run, _step_kwargs, _sync, _token


class FakeKVWriter:
    """Writes into a FakeDrafterKV what its pass would write, slot by slot."""

    def __init__(self, kv: FakeDrafterKV) -> None:
        self.kv, self.calls = kv, []

    def __call__(self, input_ids, positions, hidden, slot_mapping) -> None:
        self.calls.append(len(input_ids))
        for i, p, h, s in zip(input_ids.tolist(), positions.tolist(), hidden.tolist(),
                              slot_mapping.tolist()):
            self.kv.kv[s] = (i, p, tuple(h))


def _run_with_writer(sync):
    """_run, with the flushes going to a writer over the same fake KV."""
    kv = FakeDrafterKV()
    writer = FakeKVWriter(kv)
    sync.attach_kv_writer(writer)
    got, deferred = _run(SCRIPT, sync, kv)
    return got, deferred, writer


def test_kv_only_flushes_write_the_same_kv_as_every_step():
    sync = _sync()
    got, deferred, writer = _run_with_writer(sync)
    want, _ = _run(SCRIPT, None)
    assert got.kv == want.kv
    assert sync.flushes == len(writer.calls) >= 3 and sync.deferred_steps >= 8
    # No flush went through the drafter's pass: every pass recorded is a step's own.
    assert len(got.passes) == deferred.count(False)


def test_kv_only_flush_inputs_are_the_successors():
    sync, kv = _sync(), FakeDrafterKV()
    writer = FakeKVWriter(kv)
    sync.attach_kv_writer(writer)
    for pos in range(1, 4):
        assert sync.step(0, ["A", "B"], _step_kwargs([("A", pos, 1), ("B", pos + 5, 1)]),
                         None, 0, kv)
    assert not sync.step(1, ["B", "A"], _step_kwargs([("B", 9, 1), ("A", 4, 1)], k=1),
                         None, 0, kv)
    assert writer.calls == [6] and not kv.passes
    # Each kept token's slot holds its successor: the next kept token, then the step's first.
    for req, first in (("A", 1), ("B", 6)):
        for pos in range(first, first + 3):
            slot = 100_000 * (ord(req) - ord("A") + 1) + pos
            assert kv.kv[slot][:2] == (_token(req, pos + 1), pos)


def test_without_a_writer_the_depth_falls_back_to_a_full_pass():
    sync = _sync(depth=8)
    sync.full_flush_depth = 5
    sync.attach_kv_writer(None)
    assert sync.depth == 5 and sync.kv_writer is None


def test_kv_only_applies_to_single_layer_eagle_drafters_by_class():
    from specdec_plugin.spec_decode.drafter_kv_writer import kv_only_applies

    # Names vLLM maps to the same class count as that class (its model registry).
    assert kv_only_applies(["LlamaForCausalLMEagle3"], 1, "auto")
    assert kv_only_applies(["EagleLlamaForCausalLM"], 1, "auto")
    assert not kv_only_applies(["Eagle3LlamaForCausalLM"], 2, "auto")  # more than one layer
    assert not kv_only_applies(["Eagle3LlamaForCausalLM"], 1, "fp8")   # quantized KV cache
    assert not kv_only_applies(["LlamaForCausalLM"], 1, "auto")         # a draft model
    assert not kv_only_applies(["DeepSeekMTPModel"], 1, "auto")         # not registered
    assert not kv_only_applies(None, 1, "auto")


def test_uncache_window_covers_the_kv_only_depth(monkeypatch):
    """Positions a finished request may not have written yet: 16 kept with KV-only flushes."""
    from types import SimpleNamespace

    from specdec_plugin.spec_decode.deferred_sync import (
        DEFAULT_DEPTH,
        KV_ONLY_DEPTH,
        uncache_window,
    )

    draft = SimpleNamespace(hf_config=SimpleNamespace(architectures=["LlamaForCausalLMEagle3"],
                                                      num_hidden_layers=1))
    spec = SimpleNamespace(use_eagle=lambda: True, uses_draft_model=lambda: False,
                           num_speculative_tokens=3, draft_model_config=draft)
    config = SimpleNamespace(speculative_config=spec, cache_config=SimpleNamespace(
        enable_prefix_caching=True, cache_dtype="auto"))
    monkeypatch.setenv("SPECDEC_DEFER_DRAFTER_SYNC", "1")
    assert uncache_window(config) == KV_ONLY_DEPTH + 3 + 1
    monkeypatch.setenv("SPECDEC_KV_ONLY_FLUSH", "0")
    assert uncache_window(config) == DEFAULT_DEPTH + 3 + 1
