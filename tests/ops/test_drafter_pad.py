"""Drafter-batch padding (``ops/drafter_pad``): the torch reference against a per-request loop
written from the package docstring, and every registered provider against the reference
(Triton's on a GPU: ``gpu``; small shapes also under Triton's interpreter here).

Inputs are fresh random values each run (the seed is in every failure message), never zeros:
token ids, positions, hidden states, slots and block ids all start at 1, and the output
buffers start filled with other random values, so a slot the kernel forgets to write shows.
"""
from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything compiles a Triton kernel

from specdec_plugin.ops.contract import ContractError  # noqa: E402
from specdec_plugin.ops.drafter_pad.reference import pad_drafter_batch as reference  # noqa: E402
from tests.ops.providers import (  # noqa: E402
    device_for,
    kernel,
    providers_to_compare,
    small_shape_device,
)

FOLDER = "drafter_pad"
FAKE = 4095  # max_model_len - 1


def batch(seed: int, num_reqs: int, padded: int, query_len: int, hidden: int, width_in: int,
          width_out: int, with_tis: bool, with_rej: bool, device: str = "cpu"):
    """(inputs, outputs) keyword dicts for one call; outputs hold random garbage."""
    g = torch.Generator().manual_seed(seed)

    def ints(*shape, lo=1, hi=1000, dtype=torch.int32):
        return torch.randint(lo, hi, shape, generator=g, dtype=dtype)

    lens = ints(num_reqs, lo=1, hi=query_len + 1)
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(lens, 0)
    total = int(qsl[-1])
    rejected = (torch.rand(num_reqs, generator=g) * lens).long().clamp(max=lens.long() - 1).int()
    tis = qsl[1:] - 1 - rejected
    seq_lens = lens + ints(num_reqs, lo=1, hi=3000)
    inputs = dict(
        target_token_ids=ints(total, hi=49152), target_positions=ints(total, hi=3000, dtype=torch.int64),
        target_hidden_states=torch.rand(total, hidden, generator=g) + 0.5,
        next_token_ids=ints(num_reqs, hi=49152),
        token_indices_to_sample=tis if with_tis else None,
        num_rejected_tokens=rejected if with_rej else None,
        query_start_loc=qsl, seq_lens=seq_lens,
        block_table=ints(num_reqs + 3, width_in, hi=5000),  # more rows than requests, as vLLM's
        slot_mapping=ints(total + 5, hi=80000, dtype=torch.int64),
    )
    rows = padded * query_len
    outputs = dict(
        out_token_ids=ints(rows, hi=9), out_positions=ints(rows, hi=9, dtype=torch.int64),
        out_hidden_states=torch.rand(rows, hidden, generator=g) + 7,
        out_next_token_ids=ints(padded, hi=9), out_token_indices_to_sample=ints(padded, hi=9),
        out_num_rejected=ints(padded, hi=9), out_seq_lens=ints(padded, hi=9),
        out_block_table=ints(padded, width_out, hi=9), out_slot_mapping=ints(rows, hi=9, dtype=torch.int64),
    )
    move = {k: (v.to(device) if v is not None else None) for k, v in inputs.items()}
    return move, {k: v.to(device) for k, v in outputs.items()}


def by_loop(inputs, outputs, query_len):
    """The docstring's layout, one request at a time."""
    i, o = {k: (v.cpu() if v is not None else None) for k, v in inputs.items()}, \
        {k: v.cpu().clone() for k, v in outputs.items()}
    q, num_reqs, padded = query_len, i["next_token_ids"].shape[0], o["out_next_token_ids"].shape[0]
    for r in range(padded):
        base = r * q
        o["out_block_table"][r] = 0
        if r >= num_reqs:
            o["out_token_ids"][base:base + q] = 0
            o["out_positions"][base:base + q] = FAKE
            o["out_slot_mapping"][base:base + q] = -1
            o["out_hidden_states"][base:base + q] = 0
            o["out_next_token_ids"][r], o["out_seq_lens"][r] = 0, q
            o["out_num_rejected"][r], o["out_token_indices_to_sample"][r] = q - 1, base
            continue
        start, end = int(i["query_start_loc"][r]), int(i["query_start_loc"][r + 1])
        n, pad = end - start, q - (end - start)
        for j in range(q):
            if j < n:
                o["out_token_ids"][base + j] = i["target_token_ids"][start + j]
                o["out_positions"][base + j] = i["target_positions"][start + j]
                o["out_slot_mapping"][base + j] = i["slot_mapping"][start + j]
                o["out_hidden_states"][base + j] = i["target_hidden_states"][start + j]
            else:
                o["out_token_ids"][base + j] = 0
                o["out_positions"][base + j] = min(int(i["target_positions"][end - 1]) + j - n + 1, FAKE)
                o["out_slot_mapping"][base + j] = -1
                o["out_hidden_states"][base + j] = 0
        o["out_next_token_ids"][r] = i["next_token_ids"][r]
        o["out_seq_lens"][r] = i["seq_lens"][r] + pad
        rej = 0 if i["num_rejected_tokens"] is None else int(i["num_rejected_tokens"][r])
        o["out_num_rejected"][r] = rej + pad
        tis = end - 1 if i["token_indices_to_sample"] is None else int(i["token_indices_to_sample"][r])
        o["out_token_indices_to_sample"][r] = base + tis - start
        w = min(i["block_table"].shape[1], o["out_block_table"].shape[1])
        o["out_block_table"][r, :w] = i["block_table"][r, :w]
    return o


# (num_reqs, padded, query_len, hidden, width_in, width_out): some requests padded, none
# padded, all filler, K=1, a hidden width past one tile, block tables narrower and wider.
SHAPES = [(5, 8, 4, 64, 10, 12), (8, 8, 5, 300, 12, 12), (0, 4, 3, 32, 6, 6),
          (3, 4, 2, 16, 20, 9), (1, 1, 5, 600, 4, 4), (13, 16, 4, 48, 7, 7)]


def fresh_seed() -> int:
    return random.SystemRandom().randrange(2**31)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("optional", [(True, True), (False, False), (True, False)], ids=str)
def test_reference_matches_docstring_loop(shape, optional):
    seed = fresh_seed()
    num_reqs, padded, q, hidden, w_in, w_out = shape
    inputs, outputs = batch(seed, num_reqs, padded, q, hidden, w_in, w_out, *optional)
    want = by_loop(inputs, outputs, q)
    reference(**inputs, **outputs, query_len=q, fake_position=FAKE)
    for name, value in want.items():
        assert torch.equal(outputs[name], value), f"{name} differs (seed {seed})"


def run_both(impl, device, shape, optional, seed):
    num_reqs, padded, q, hidden, w_in, w_out = shape
    got_in, got_out = batch(seed, num_reqs, padded, q, hidden, w_in, w_out, *optional, device=device)
    want_in, want_out = batch(seed, num_reqs, padded, q, hidden, w_in, w_out, *optional)
    impl(**got_in, **got_out, query_len=q, fake_position=FAKE)
    reference(**want_in, **want_out, query_len=q, fake_position=FAKE)
    for name in want_out:
        assert torch.equal(got_out[name].cpu(), want_out[name]), f"{name} differs (seed {seed})"


CASES = {"pad_drafter_batch": run_both}


@pytest.mark.parametrize("op,provider", providers_to_compare(FOLDER))
@pytest.mark.parametrize("shape", SHAPES + [(200, 256, 5, 12288, 128, 128)], ids=str)
@pytest.mark.parametrize("optional", [(True, True), (False, False)], ids=str)
def test_provider_matches_reference(op, provider, shape, optional):
    CASES[op](kernel(op, provider), device_for(provider), shape, optional, fresh_seed())


@pytest.mark.parametrize("shape", SHAPES[:3], ids=str)
def test_triton_small_shapes(shape):
    device = small_shape_device()
    run_both(kernel("pad_drafter_batch", "triton"), device, shape, (True, True), fresh_seed())


def test_contract_names_the_field():
    inputs, outputs = batch(fresh_seed(), 4, 3, 4, 8, 4, 4, True, True)  # padded < requests
    with pytest.raises(ContractError, match="out_next_token_ids"):
        reference(**inputs, **outputs, query_len=4, fake_position=FAKE)
    inputs, outputs = batch(fresh_seed(), 4, 4, 4, 8, 4, 4, True, True)
    outputs["out_hidden_states"] = outputs["out_hidden_states"][:, :4]
    with pytest.raises(ContractError, match="out_hidden_states"):
        reference(**inputs, **outputs, query_len=4, fake_position=FAKE)
