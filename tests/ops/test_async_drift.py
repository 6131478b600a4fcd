"""The computed-token correction under async speculative decoding (``ops/async_drift``): the
torch reference against vLLM's own function (run without ``torch.compile``), and every
registered provider against the reference (Triton's on a GPU: ``gpu``; small shapes also under
Triton's interpreter here).

Inputs are fresh random values each run (the seed is in every failure message): batches that
keep, drop, add and reorder requests, previous batches of one request (the sizes that made
vLLM's compiled function compile again while serving), counts that start away from zero.
"""
from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything compiles a Triton kernel

from specdec_plugin.ops.async_drift.reference import (  # noqa: E402
    correct_computed_tokens as reference,
)
from specdec_plugin.ops.contract import ContractError  # noqa: E402
from tests.ops.providers import (  # noqa: E402
    device_for,
    kernel,
    providers_to_compare,
    small_shape_device,
)

FOLDER = "async_drift"
MAX_REQS = 700  # past the Triton kernel's 256-row chunk, as vLLM's max_num_seqs can be


def batch(seed: int, n: int, prev_n: int, device: str = "cpu") -> dict:
    """One call's arguments: the current batch of ``n`` rows, whose requests sit at random rows
    of a previous batch of ``prev_n`` (or are new, -1), each row of it drafted or not."""
    g = torch.Generator().manual_seed(seed)
    stayed = min(n, prev_n, int(torch.randint(0, min(n, prev_n) + 1, (), generator=g)))
    prev_rows = torch.randperm(prev_n, generator=g)[:stayed]
    prev_positions = torch.full((n,), -1, dtype=torch.int64)
    prev_positions[torch.randperm(n, generator=g)[:stayed]] = prev_rows
    args = dict(
        num_computed_tokens=torch.randint(1, 4000, (MAX_REQS,), generator=g, dtype=torch.int32),
        num_accepted_tokens=torch.randint(0, 6, (n,), generator=g, dtype=torch.int32),
        prev_positions=prev_positions,
        valid_sampled_token_count=torch.randint(1, 6, (prev_n,), generator=g, dtype=torch.int64),
        prev_num_draft_tokens=torch.randint(0, 5, (MAX_REQS,), generator=g, dtype=torch.int32),
        cpu_num_computed_tokens=torch.randint(1, 4000, (n,), generator=g, dtype=torch.int32),
    )
    return {name: t.to(device) for name, t in args.items()}


def _cases(count: int) -> list[tuple[int, int, int]]:
    rng = random.Random()
    sizes = [(1, 16), (16, 1), (1, 1), (MAX_REQS, MAX_REQS), (600, 2), (2, 600)]
    sizes += [(rng.randint(1, 96), rng.randint(1, 96)) for _ in range(count // 2)]
    sizes += [(rng.randint(1, MAX_REQS), rng.randint(1, MAX_REQS))
              for _ in range(count - count // 2)]
    return [(rng.randrange(1 << 30), n, prev_n) for n, prev_n in sizes]


def _run(fn, args: dict) -> tuple[torch.Tensor, torch.Tensor]:
    args = {name: t.clone() for name, t in args.items()}
    fn(**args)
    return args["num_computed_tokens"].cpu(), args["num_accepted_tokens"].cpu()


@pytest.mark.parametrize("seed,n,prev_n", _cases(8))
def test_reference_matches_vllms_function(seed, n, prev_n):
    from vllm.v1.spec_decode.utils import update_num_computed_tokens_for_batch_change

    vllm_eager = update_num_computed_tokens_for_batch_change._torchdynamo_orig_callable
    args = batch(seed, n, prev_n)
    expected = _run(vllm_eager, args)
    got = _run(reference, args)
    for name, a, b in zip(("num_computed_tokens", "num_accepted_tokens"), got, expected):
        assert torch.equal(a, b), f"seed {seed}, n {n}, prev {prev_n}: {name} differs"
    # Something changed, or the comparison says little.
    assert not torch.equal(got[0], args["num_computed_tokens"]), f"seed {seed}"


def run_both(fn, device: str, seed: int, n: int, prev_n: int) -> None:
    """``fn`` on ``device`` against the reference on the CPU, same inputs."""
    expected = _run(reference, batch(seed, n, prev_n))
    got = _run(fn, batch(seed, n, prev_n, device))
    for name, a, b in zip(("num_computed_tokens", "num_accepted_tokens"), got, expected):
        assert torch.equal(a, b), f"{device}, seed {seed}, n {n}, prev {prev_n}: {name} differs"


CASES = {"correct_computed_tokens": run_both}


@pytest.mark.parametrize("op,provider", providers_to_compare(FOLDER))
@pytest.mark.parametrize("seed,n,prev_n", _cases(12))
def test_provider_matches_reference(op, provider, seed, n, prev_n):
    CASES[op](kernel(op, provider), device_for(provider), seed, n, prev_n)


@pytest.mark.parametrize("seed,n,prev_n", _cases(2)[:4])
def test_triton_kernel_small_shapes(seed, n, prev_n):
    from specdec_plugin.ops.async_drift.triton import correct_computed_tokens as triton_kernel

    run_both(triton_kernel, small_shape_device(), seed, n, prev_n)


@pytest.mark.parametrize("provider", ["torch", "triton"])
def test_rows_read_the_counts_from_before_the_call(provider):
    # Two requests swap rows: each must read the other's old count, not its new one.
    if provider == "triton":
        from specdec_plugin.ops.async_drift.triton import correct_computed_tokens as fn
        device = small_shape_device()
    else:
        fn, device = reference, "cpu"
    args = dict(
        num_computed_tokens=torch.tensor([100, 200, 7], dtype=torch.int32),
        num_accepted_tokens=torch.tensor([9, 9], dtype=torch.int32),
        prev_positions=torch.tensor([1, 0], dtype=torch.int64),
        valid_sampled_token_count=torch.tensor([3, 5], dtype=torch.int64),
        prev_num_draft_tokens=torch.tensor([2, 2, 0], dtype=torch.int32),
        cpu_num_computed_tokens=torch.tensor([1, 1], dtype=torch.int32),
    )
    computed, accepted = _run(fn, {name: t.to(device) for name, t in args.items()})
    assert computed.tolist() == [205, 103, 7] and accepted.tolist() == [5, 3]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32])
def test_counts_of_any_integer_type(dtype):
    # vLLM's function casts the previous batch's counts; so do both providers.
    args = batch(random.randrange(1 << 30), 40, 30)
    expected = _run(reference, args)
    args["valid_sampled_token_count"] = args["valid_sampled_token_count"].to(dtype)
    args["prev_num_draft_tokens"] = args["prev_num_draft_tokens"].to(dtype)
    from specdec_plugin.ops.async_drift.triton import correct_computed_tokens as triton_kernel

    device = small_shape_device()
    for fn, where in ((reference, "cpu"), (triton_kernel, device)):
        got = _run(fn, {name: t.to(where) for name, t in args.items()})
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), (fn, dtype)


def test_bad_shapes_name_the_argument():
    args = batch(1, 4, 4)
    args["num_accepted_tokens"] = args["num_accepted_tokens"][:3]
    with pytest.raises(ContractError, match="num_accepted_tokens"):
        reference(**args)
