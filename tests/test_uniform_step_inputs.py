"""UniformStepInputsMixin (worker/uniform_step_inputs.py) against vLLM 0.26's own methods.

Both methods run here as vLLM's code (``GPUModelRunner``'s functions on a small stand-in holding
the state they read) and as the mixin over the same code, on fresh random batches: uniform ones
(the mixin's own path) and others (where it must hand over to vLLM). The input ids they write,
and every field of the spec-decode metadata they return, must be equal. The engine-level
checks are the greedy-equality tests: on the CPU every speculative method's
(``_calc_spec_decode_metadata`` runs on any device); on a GPU (tests/gpu) the async ones.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm.v1.utils import CpuGpuBuffer
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from specdec_plugin.worker.uniform_step_inputs import UniformStepInputsMixin, uniform_layout

MAX_TOKENS = 4096
DEVICE = torch.device("cpu")


class _VllmRunner:
    """The state vLLM's two methods read, and the methods themselves, unchanged."""

    _get_cumsum_and_arange = GPUModelRunner._get_cumsum_and_arange

    def _prepare_input_ids(self, *args):
        self.vllm_calls["input_ids"] += 1
        return GPUModelRunner._prepare_input_ids(self, *args)

    def _calc_spec_decode_metadata(self, *args):
        self.vllm_calls["metadata"] += 1
        return GPUModelRunner._calc_spec_decode_metadata(self, *args)

    def __init__(self):
        self.vllm_calls = {"input_ids": 0, "metadata": 0}
        self.device = DEVICE
        self.enable_prompt_embeds = False
        self.arange_np = np.arange(MAX_TOKENS, dtype=np.int64)
        self._arange_scratch = np.empty(MAX_TOKENS, dtype=np.int64)
        self.input_ids = CpuGpuBuffer(MAX_TOKENS, dtype=torch.int32, device=DEVICE,
                                      pin_memory=False)
        self.prev_positions = CpuGpuBuffer(MAX_TOKENS, dtype=torch.int64, device=DEVICE,
                                           pin_memory=False)
        self.input_batch = SimpleNamespace(prev_sampled_token_ids=None, req_ids=[])
        self._draft_token_ids = None
        self.prev_num_spec_tokens = 0


class _LeanRunner(UniformStepInputsMixin, _VllmRunner):
    pass


def _step(rng: np.random.Generator, uniform: bool):
    """A batch: scheduler output, per-request token counts, the previous step's sampled and
    draft tokens, and each row's previous row (-1: new)."""
    # Uniform batches from a few sizes, so that shapes come back and kept tensors get used.
    num_reqs = int(rng.choice([1, 2, 7, 64]) if uniform else rng.integers(1, 65))
    width = int(rng.integers(1, 4))  # the previous step's draft width (K)
    prev_rows = num_reqs + int(rng.integers(0, 4))
    req_ids = [f"r{i}" for i in range(num_reqs)]
    if uniform:
        drafts = [int(rng.integers(0, width + 1))] * num_reqs
        prev_positions = np.arange(num_reqs)
    else:  # one of the ways a batch stops being uniform
        kind = rng.integers(0, 3)
        drafts = [int(rng.integers(0, width + 1)) for _ in range(num_reqs)]
        prev_positions = np.arange(num_reqs)
        if kind == 1 or (kind == 0 and num_reqs == 1):
            prev_positions = rng.permutation(prev_rows)[:num_reqs]
        elif kind == 2:
            prev_positions = np.where(rng.random(num_reqs) < 0.3, -1, np.arange(num_reqs))
    scheduled = np.array([1 + d for d in drafts], dtype=np.int32)
    spec = {req_ids[i]: list(rng.integers(0, 32000, d)) for i, d in enumerate(drafts) if d}
    state = {
        "req_ids": req_ids,
        "prev_positions": prev_positions,
        "prev_sampled": torch.from_numpy(rng.integers(0, 32000, (prev_rows, 1))).to(torch.int32),
        "prev_drafts": torch.from_numpy(rng.integers(0, 32000, (prev_rows, width))).to(torch.int32),
        "host_ids": torch.from_numpy(rng.integers(0, 32000, MAX_TOKENS)).to(torch.int32),
    }
    out = SimpleNamespace(scheduled_spec_decode_tokens=spec)
    return out, scheduled, np.array(drafts, dtype=np.int32), state


def _load(runner: _VllmRunner, state: dict, garbage: torch.Tensor) -> None:
    n = len(state["req_ids"])
    runner.input_batch.req_ids = state["req_ids"]
    runner.input_batch.prev_sampled_token_ids = state["prev_sampled"]
    runner._draft_token_ids = state["prev_drafts"]
    runner.prev_num_spec_tokens = state["prev_drafts"].shape[1]
    runner.prev_positions.np[:n] = state["prev_positions"]
    runner.input_ids.cpu.copy_(state["host_ids"])
    runner.input_ids.gpu.copy_(garbage)  # what the previous step left there


def _run(runner, out, scheduled, drafts, state, garbage):
    _load(runner, state, garbage)
    n = len(state["req_ids"])
    cu = runner._get_cumsum_and_arange(scheduled, np.empty(MAX_TOKENS, dtype=np.int64))
    total = int(cu[-1])
    runner._prepare_input_ids(out, n, total, cu)
    meta = (runner._calc_spec_decode_metadata(drafts, cu) if drafts.any() else None)
    return runner.input_ids.gpu[:total].clone(), meta


def _assert_same_metadata(want, got):
    if want is None:
        assert got is None
        return
    assert got.num_draft_tokens == want.num_draft_tokens
    assert got.max_spec_len == want.max_spec_len
    for field in ("draft_token_ids", "cu_num_draft_tokens", "cu_num_sampled_tokens",
                  "target_logits_indices", "bonus_logits_indices", "logits_indices"):
        a, b = getattr(want, field), getattr(got, field)
        assert a.dtype == b.dtype and torch.equal(a, b), field


@pytest.mark.parametrize("uniform", [True, False])
def test_input_ids_and_metadata_equal_vllms(uniform):
    rng = np.random.default_rng()
    vllm_runner, lean = _VllmRunner(), _LeanRunner()
    drafting = 0
    for _ in range(60):  # several steps: the lean runner's kept index tensors get reused
        out, scheduled, drafts, state = _step(rng, uniform)
        garbage = torch.from_numpy(rng.integers(0, 32000, MAX_TOKENS)).to(torch.int32)
        want_ids, want_meta = _run(vllm_runner, out, scheduled, drafts, state, garbage)
        got_ids, got_meta = _run(lean, out, scheduled, drafts, state, garbage)
        assert torch.equal(got_ids, want_ids)
        _assert_same_metadata(want_meta, got_meta)
        drafting += got_meta is not None
        if got_meta is not None:  # a fresh tensor each step: the late suffix drafts write it
            assert got_meta.draft_token_ids.untyped_storage().data_ptr() \
                != lean.input_ids.gpu.untyped_storage().data_ptr()
    if uniform:  # the mixin's own paths ran: vLLM's only for a shape's first metadata
        assert lean.vllm_calls["input_ids"] == 0
        assert lean.vllm_calls["metadata"] <= len(lean._specdec_kept_indices or ())
        # 4 sizes x 3 draft lengths at most; about 38 of the 60 steps draft
        assert lean.vllm_calls["metadata"] <= 12 < drafting


def test_kept_index_tensors_are_reused_and_bounded():
    rng = np.random.default_rng()
    lean = _LeanRunner()
    num_reqs, d = int(rng.integers(1, 65)), int(rng.integers(1, 5))
    drafts = np.full(num_reqs, d, dtype=np.int32)
    cu = np.arange(1, num_reqs + 1) * (1 + d)
    first = lean._calc_spec_decode_metadata(drafts, cu)
    second = lean._calc_spec_decode_metadata(drafts, cu)
    assert second.logits_indices is first.logits_indices  # no upload the second time
    assert second.draft_token_ids is not first.draft_token_ids
    for n in range(1, 100):
        lean._calc_spec_decode_metadata(np.full(n, 1, dtype=np.int32), np.arange(1, n + 1) * 2)
    assert len(lean._specdec_kept_indices) == 64


def test_switched_off_runs_vllms_methods(monkeypatch):
    monkeypatch.setenv("SPECDEC_LEAN_STEP_INPUTS", "0")
    lean = _LeanRunner()
    drafts = np.full(3, 2, dtype=np.int32)
    cu = np.arange(1, 4) * 3
    lean._calc_spec_decode_metadata(drafts, cu)
    lean._calc_spec_decode_metadata(drafts, cu)
    assert lean._specdec_kept_indices is None


def test_uniform_layout():
    assert uniform_layout(np.array([3, 6, 9]), 3, 2)
    assert not uniform_layout(np.array([3, 7, 9]), 3, 2)
    assert not uniform_layout(np.array([3, 6, 9]), 3, 1)
    assert uniform_layout(np.array([1, 2, 3, 99]), 3, 0)  # rows past num_reqs are not read
