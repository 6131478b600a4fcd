"""The split-KV workspace of the Triton paged attention (``ops/paged_attention/triton.py``):
how its partial-result buffers are laid out. The kernels themselves, against the torch
reference: tests/ops/test_paged_attention.py."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.ops.providers import small_shape_device  # noqa: E402


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7, 18, 27, 54])
def test_split_buffers_each_start_on_16_bytes(rows):
    """Triton specialises pointer arguments by 16-byte alignment: a split buffer that starts off
    it would compile another kernel variant while serving. Rows that are not a multiple of 4
    (two splits over an odd count of requests times heads) put the sum buffer there before."""
    from specdec_plugin.ops.paged_attention import triton as kernels

    device, head_pad = torch.device(small_shape_device()), 64
    acc, mx, sm = kernels._split_buffers(rows, head_pad, device)
    assert (acc.numel(), mx.numel(), sm.numel()) == (rows * head_pad, rows, rows)
    for view in (acc, mx, sm):
        assert view.data_ptr() % 16 == 0, (rows, view.data_ptr() % 16)
    # Disjoint, in order, inside the workspace a reservation of this many rows allocates.
    ends = [(v.data_ptr(), v.data_ptr() + 4 * v.numel()) for v in (acc, mx, sm)]
    assert ends[0][1] <= ends[1][0] and ends[1][1] <= ends[2][0]
    base = kernels._workspaces[device].data_ptr()
    assert ends[2][1] - base <= 4 * kernels._split_sections(rows, head_pad)[2]
