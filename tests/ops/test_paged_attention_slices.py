"""Split-KV slices of the Triton paged attention: a request takes only the slices its own keys
fill (at least ``split_min_keys`` keys each), whatever split count the launch was planned for.

Under Triton's interpreter on CPU, compiled on a GPU. Each launch starts with the split
workspace full of NaN: a slice the merge read but no program wrote would poison the output, so
every check below also proves that the merge reads exactly the slices that were written.
"""
from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from tests.ops.providers import generator, small_shape_device  # noqa: E402
from tests.ops.test_paged_attention import check_written, make_case  # noqa: E402


@pytest.fixture(scope="module")
def small():
    from specdec_plugin.ops.paged_attention import triton as kernels

    return kernels, small_shape_device()


def _poison_workspaces(kernels):
    for ws in kernels._workspaces.values():
        ws.fill_(float("nan"))


def _launch(kernels, case, num_splits, split_min_keys=None, plan_seq_len=0, poison=True):
    out = torch.full_like(case["query"], float("nan"))
    if poison:  # a first launch allocates the workspace; then fill it with NaN and go again
        kernels.paged_attention_splits(**case, out=out, num_splits=num_splits,
                                       plan_seq_len=plan_seq_len, split_min_keys=split_min_keys)
        _poison_workspaces(kernels)
        out.fill_(float("nan"))
    kernels.paged_attention_splits(**case, out=out, num_splits=num_splits,
                                   plan_seq_len=plan_seq_len, split_min_keys=split_min_keys)
    return out


def _expected_slices(kv_end, num_splits, split_min_keys, block_n):
    """The rule of ``_split_range``, written out in Python."""
    n_tiles = -(-kv_end // block_n)
    keys_per_split = max(split_min_keys, -(-n_tiles // num_splits) * block_n)
    return -(-kv_end // keys_per_split)


def test_each_request_writes_only_the_slices_its_keys_fill(small):
    """Decode rows of 20, 100, 300 and 700 keys under a plan of 8 slices of at least 128 keys
    (fp32: 32-key tiles): the split workspace holds finite partials in exactly the slices the
    rule gives each request (1, 1, 3, 6) and NaN in the rest; the output matches the
    reference."""
    kernels, device = small
    seq_lens = [20, 100, 300, 700]
    case = make_case([1] * 4, seq_lens, 2, 1, 32, 16, torch.float32, device,
                     generator=generator(random.randrange(1 << 30)))
    num_splits, min_keys = 8, 128
    out = _launch(kernels, case, num_splits, min_keys)
    check_written(out, case)

    plan = kernels._launch_plan(4, 1, 2, 1, 32, torch.float32, None, max(seq_lens), 64,
                                num_splits, min_keys)
    assert (plan.block_n, plan.split_min_keys) == (32, 128)
    rows = 4 * 1 * 2 * num_splits  # requests x max_query_len x q heads x slices
    _, part_max, _ = kernels._split_buffers(rows, plan.head_pad, torch.device(device))
    written = ~torch.isnan(part_max.view(4, 2, num_splits))  # [request, q head, slice]
    expected = [_expected_slices(s, num_splits, min_keys, 32) for s in seq_lens]
    assert expected == [1, 1, 3, 6]
    for i, live in enumerate(expected):
        # A one-slice request is written straight to ``out``: no partial at all.
        want = [j < live and live > 1 for j in range(num_splits)]
        assert written[i].tolist() == [want, want], f"request {i} ({seq_lens[i]} keys)"


def test_a_one_slice_request_equals_the_unsplit_launch_bit_for_bit(small):
    """A request whose keys fit in one slice skips the merge: its rows are the unsplit
    kernel's, bit for bit, under any planned split count. Verification rows (1+K = 4) with
    GQA, beside a long request that does split."""
    kernels, device = small
    rng = random.Random()
    short = rng.randint(4, 60)
    case = make_case([4, 4], [short, 400], 4, 2, 32, 16, torch.float32, device,
                     generator=generator(rng.randrange(1 << 30)))
    unsplit = _launch(kernels, case, 1, poison=False)
    for num_splits in (2, 4, 16):
        split = _launch(kernels, case, num_splits, split_min_keys=64)
        check_written(split, case)
        assert torch.equal(split[:4], unsplit[:4]), f"{num_splits} slices, {short} keys"


@pytest.mark.parametrize("trial", range(3))
def test_random_batches_under_engine_like_plans(small, trial):
    """Fresh random decode / verification / prefill batches, planned as the engine plans them
    (``plan_seq_len`` far above the real contexts) with a random slice minimum: every real
    row matches the reference and nothing else is written."""
    kernels, device = small
    rng = random.Random()
    num_seqs = rng.randint(1, 5)
    q_lens = [rng.choice([1, 1 + rng.randint(1, 7), 0]) for _ in range(num_seqs)]
    if max(q_lens) == 0:
        q_lens[0] = 1
    seq_lens = [q + rng.randint(0, 500) if q else 0 for q in q_lens]
    hkv = rng.choice([1, 2])
    case = make_case(q_lens, seq_lens, hkv * rng.choice([1, 2, 4]), hkv, 32,
                     rng.choice([16, 32]), torch.float32, device,
                     generator=generator(rng.randrange(1 << 30)))
    out = _launch(kernels, case, rng.choice([2, 4, 8, 16]),
                  split_min_keys=rng.choice([None, 64, 96, 256, 1024]), plan_seq_len=4096)
    check_written(out, case)
