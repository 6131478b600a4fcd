"""PlainStepBookkeepingMixin (worker/plain_step_bookkeeping.py): what it leaves out after a step
that verified no drafts, and the equivalence that makes leaving it out safe.

The engine-level proof is the GPU greedy tests (tests/gpu, async speculative decoding only
runs on a GPU); here, on fresh random batches: vLLM's device correction with no drafts equals
the host values its other branch copies, and the mixin keeps vLLM's path whenever drafts were
verified.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from vllm.v1.spec_decode.utils import update_num_computed_tokens_for_batch_change

from specdec_plugin.worker.plain_step_bookkeeping import PlainStepBookkeepingMixin


def test_correction_without_drafts_is_the_host_copy():
    """With no request's drafts verified in the previous step, vLLM's correction writes the
    host's computed-token counts and leaves the accepted counts alone: exactly what its other
    branch (a copy of the host values) does."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
    for _ in range(20):
        prev_rows = int(torch.randint(1, 65, (), generator=gen))
        rows = int(torch.randint(1, 65, (), generator=gen))
        computed = torch.randint(1, 4000, (max(rows, prev_rows) + 3,), generator=gen,
                                 dtype=torch.int32)
        accepted = torch.randint(1, 6, (rows,), generator=gen, dtype=torch.int32)
        # Each current row's previous row, or -1 for a new request.
        prev_positions = torch.randint(-1, prev_rows, (rows,), generator=gen)
        valid = torch.randint(0, 6, (prev_rows,), generator=gen, dtype=torch.int32)
        no_drafts = torch.zeros(prev_rows + 2, dtype=torch.int32)
        host = torch.randint(1, 4000, (rows,), generator=gen, dtype=torch.int32)
        corrected, corrected_accepted = computed.clone(), accepted.clone()
        update_num_computed_tokens_for_batch_change(corrected, corrected_accepted,
                                                    prev_positions, valid, no_drafts, host)
        copied = computed.clone()
        copied[:rows].copy_(host)
        assert torch.equal(corrected, copied)
        assert torch.equal(corrected_accepted, accepted)


class _Runner:
    """The vLLM runner methods the mixin wraps, recording what reaches them."""

    def __init__(self, rows: int):
        self.use_async_spec_decode = True
        self.valid_sampled_token_count_event = object()
        self.valid_sampled_token_count_gpu = None
        self.prev_num_draft_tokens = SimpleNamespace(np=np.zeros(rows, dtype=np.int32))
        self.input_batch = SimpleNamespace(prev_sampled_token_ids=None)
        self.host_copies = 0
        self.drafts_last_step: dict[int, int] = {}

    def execute_model(self, scheduler_output, *args, **kwargs):
        return "executed"

    def _update_states(self, scheduler_output, *args, **kwargs):
        self.prev_num_draft_tokens.np.fill(0)
        for row, n in self.drafts_last_step.items():
            self.prev_num_draft_tokens.np[row] = n
        return "updated"

    def _copy_valid_sampled_token_count(self, next_token_ids, counts):
        self.host_copies += 1
        self.valid_sampled_token_count_gpu = counts
        self.input_batch.prev_sampled_token_ids = next_token_ids.unsqueeze(1)


class _Mixed(PlainStepBookkeepingMixin, _Runner):
    pass


def _step(runner: _Mixed, drafts: dict[str, list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    assert runner.execute_model(SimpleNamespace(scheduled_spec_decode_tokens=drafts)) == "executed"
    rows = runner.prev_num_draft_tokens.np.shape[0]
    next_ids = torch.randint(0, 32000, (rows,), dtype=torch.int32)
    counts = torch.randint(0, 5, (rows,), dtype=torch.int32)
    runner._copy_valid_sampled_token_count(next_ids, counts)
    return next_ids, counts


def test_host_copy_only_after_a_step_that_verified_drafts():
    rows = int(np.random.default_rng().integers(2, 65))
    runner = _Mixed(rows)
    next_ids, counts = _step(runner, {})  # a plain step: no host copy, device results kept
    assert runner.host_copies == 0
    assert runner.valid_sampled_token_count_gpu is counts
    assert torch.equal(runner.input_batch.prev_sampled_token_ids[:, 0], next_ids)
    _step(runner, {"r0": [5, 6]})  # drafts verified: vLLM's method, copy included
    assert runner.host_copies == 1
    _step(runner, {"r1": []})  # slots reserved, drafts trimmed to none: still vLLM's (safe side)
    assert runner.host_copies == 2


def test_device_correction_dropped_only_when_no_row_verified_drafts():
    rows = int(np.random.default_rng().integers(2, 65))
    runner = _Mixed(rows)
    _, counts = _step(runner, {})
    assert runner._update_states(None) == "updated"
    assert runner.valid_sampled_token_count_gpu is None  # vLLM then copies the host values
    _, counts = _step(runner, {"r0": [1]})
    runner.drafts_last_step = {int(np.random.default_rng().integers(0, rows)): 1}
    runner._update_states(None)
    assert runner.valid_sampled_token_count_gpu is counts  # vLLM's correction runs
    runner.use_async_spec_decode = False  # nothing is stashed without async spec decode
    runner.drafts_last_step = {}
    runner._update_states(None)
    assert runner.valid_sampled_token_count_gpu is counts


def test_switched_off_runs_vllms_bookkeeping_after_every_step(monkeypatch):
    monkeypatch.setenv("SPECDEC_LEAN_PLAIN_STEPS", "0")
    rows = int(np.random.default_rng().integers(2, 65))
    runner = _Mixed(rows)
    _, counts = _step(runner, {})
    assert runner.host_copies == 1
    runner._update_states(None)
    assert runner.valid_sampled_token_count_gpu is counts
