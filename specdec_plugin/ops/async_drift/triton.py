"""Triton computed-token correction; same signature and results as ``reference.py``.

One program, so that every read can finish before any write: rows are permuted between
batches, and a row may read the old count of a row another request overwrites. Phase one
computes every row's new values into a scratch buffer, a barrier, then phase two writes them.
The row count changes every step and the inputs may be views at any offset: neither the count
nor the pointers' alignment is specialised, so the one variant compiled at start-up
(worker/kernel_warmup.py) serves every batch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_plugin.ops.async_drift.validate import check_correct_computed_tokens

_BLOCK = 256


@triton.jit(do_not_specialize=["n"],
            do_not_specialize_on_alignment=["computed_ptr", "accepted_ptr", "prev_pos_ptr",
                                            "valid_ptr", "drafts_ptr", "cpu_ptr", "scratch_ptr"])
def _correct_computed_tokens_kernel(computed_ptr, accepted_ptr, prev_pos_ptr, valid_ptr,
                                    drafts_ptr, cpu_ptr, scratch_ptr, n, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)
    for start in range(0, n, BLOCK):
        i = start + rows
        live = i < n
        p = tl.load(prev_pos_ptr + i, mask=live, other=-1)
        was_there = p >= 0
        q = tl.where(was_there, p, 0)
        valid = tl.load(valid_ptr + q, mask=live & was_there, other=0)
        drafted = tl.load(drafts_ptr + q, mask=live & was_there, other=0) > 0
        carried = was_there & drafted
        old = tl.load(computed_ptr + q, mask=live & carried, other=0)
        cpu = tl.load(cpu_ptr + i, mask=live, other=0)
        new_computed = tl.where(carried, old + valid.to(old.dtype), cpu.to(old.dtype))
        tl.store(scratch_ptr + i, new_computed.to(scratch_ptr.dtype.element_ty), mask=live)
        accepted = tl.load(accepted_ptr + i, mask=live, other=0)
        tl.store(accepted_ptr + i, tl.where(carried, valid.to(accepted.dtype), accepted),
                 mask=live)
    tl.debug_barrier()  # every old count is read before the first is overwritten
    for start in range(0, n, BLOCK):
        i = start + rows
        live = i < n
        tl.store(computed_ptr + i, tl.load(scratch_ptr + i, mask=live, other=0), mask=live)


def correct_computed_tokens(num_computed_tokens: torch.Tensor, num_accepted_tokens: torch.Tensor,
                            prev_positions: torch.Tensor, valid_sampled_token_count: torch.Tensor,
                            prev_num_draft_tokens: torch.Tensor,
                            cpu_num_computed_tokens: torch.Tensor) -> None:
    n = check_correct_computed_tokens(num_computed_tokens, num_accepted_tokens, prev_positions,
                                      valid_sampled_token_count, prev_num_draft_tokens,
                                      cpu_num_computed_tokens)
    if n == 0:
        return
    scratch = torch.empty(n, dtype=num_computed_tokens.dtype, device=num_computed_tokens.device)
    _correct_computed_tokens_kernel[(1,)](
        num_computed_tokens, num_accepted_tokens, prev_positions, valid_sampled_token_count,
        prev_num_draft_tokens, cpu_num_computed_tokens, scratch, n, BLOCK=_BLOCK)
