"""Triton n-gram step update; same signature and results as ``reference.py``.

One program per request: its sampled row is read once, and the count, the next token and the
append follow from it in registers. Only the row's padded width (``BLOCK``) is specialised:
the draft length (hence the width) changes from step to step under adaptive drafting, and the
proposer compiles each padded width at start-up (spec_decode/ngram_device.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_plugin.ops.ngram_update.validate import check_ngram_step_update


@triton.jit(do_not_specialize=["vocab_size", "width", "sampled_stride"],
            do_not_specialize_on_alignment=["sampled_ptr", "discard_ptr", "tokens_ptr",
                                            "num_ptr", "next_ptr", "count_ptr", "valid_ptr"])
def _ngram_step_update_kernel(sampled_ptr, discard_ptr, tokens_ptr, num_ptr, next_ptr,
                              count_ptr, valid_ptr, sampled_stride, tokens_stride, width,
                              max_len, vocab_size, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    in_row = cols < width
    sampled = tl.load(sampled_ptr + b * sampled_stride + cols, mask=in_row, other=-1)
    discarded = tl.load(discard_ptr + b).to(tl.int1)
    valid = tl.where(discarded, -1, sampled)
    tl.store(valid_ptr + b * width + cols, valid, mask=in_row)
    ok = in_row & (valid != -1) & (valid < vocab_size)
    count = tl.sum(ok.to(tl.int32), axis=0)
    last = tl.maximum(count - 1, 0)
    selected = tl.sum(tl.where(cols == last, valid, 0), axis=0)
    n = tl.load(num_ptr + b).to(tl.int64)
    row = tokens_ptr + b.to(tl.int64) * tokens_stride
    backup = tl.load(row + tl.minimum(tl.maximum(n - 1, 0), max_len - 1))
    tl.store(next_ptr + b, tl.where(count > 0, selected.to(next_ptr.dtype.element_ty),
                                    backup.to(next_ptr.dtype.element_ty)))
    tl.store(count_ptr + b, count)
    at = n + cols
    keep = in_row & (cols < count) & (valid != -1) & (at < max_len)
    tl.store(row + at, valid.to(tokens_ptr.dtype.element_ty), mask=keep)


def ngram_step_update(sampled_token_ids: torch.Tensor, discard_mask: torch.Tensor,
                      token_ids: torch.Tensor, num_tokens: torch.Tensor, vocab_size: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = check_ngram_step_update(sampled_token_ids, discard_mask, token_ids, num_tokens,
                                   vocab_size)
    width = sampled_token_ids.shape[1]
    device = sampled_token_ids.device
    next_token_ids = torch.empty(rows, device=device,
                                 dtype=torch.promote_types(sampled_token_ids.dtype,
                                                           token_ids.dtype))
    count = torch.empty(rows, dtype=torch.int32, device=device)
    valid = torch.empty((rows, width), dtype=sampled_token_ids.dtype, device=device)
    if rows == 0:
        return next_token_ids, count, valid
    if width > 1 and sampled_token_ids.stride(1) != 1:
        sampled_token_ids = sampled_token_ids.contiguous()
    _ngram_step_update_kernel[(rows,)](
        sampled_token_ids, discard_mask, token_ids, num_tokens, next_token_ids, count, valid,
        sampled_token_ids.stride(0), token_ids.stride(0), width, token_ids.shape[1],
        vocab_size, BLOCK=max(triton.next_power_of_2(width), 2))
    return next_token_ids, count, valid
