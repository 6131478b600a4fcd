"""The n-gram step update (``ops/ngram_update``): the torch reference against vLLM's own
``update_token_ids_ngram`` and a plain loop over the append rule, and every registered provider
against the reference (Triton's on a GPU: ``gpu``; small shapes also under Triton's interpreter
here).

Inputs are fresh random values each run (the seed is in every failure message): rows that
accepted some drafts then hit a rejected slot, rows with stray ``-1`` inside, discarded rows,
out-of-vocabulary ids, empty histories and full ones (the append must stop at the row's end).
"""
from __future__ import annotations

import os
import random
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything compiles a Triton kernel

from specdec_plugin.ops.contract import ContractError  # noqa: E402
from specdec_plugin.ops.ngram_update.reference import (  # noqa: E402
    ngram_step_update as reference,
)
from tests.ops.providers import (  # noqa: E402
    device_for,
    kernel,
    providers_to_compare,
    small_shape_device,
)

FOLDER = "ngram_update"


def batch(seed: int, rows: int, width: int, max_len: int, vocab: int,
          device: str = "cpu") -> dict:
    g = torch.Generator().manual_seed(seed)
    # Each row: some accepted tokens, then -1 (verification stopped); a few stray -1 and
    # ids past the vocabulary where vLLM's count would see them.
    accepted = torch.randint(0, width + 1, (rows, 1), generator=g)
    sampled = torch.randint(0, vocab, (rows, width), generator=g, dtype=torch.int32)
    sampled[torch.arange(width).unsqueeze(0) >= accepted] = -1
    stray = torch.rand((rows, width), generator=g) < 0.1
    sampled[stray] = -1
    sampled[torch.rand((rows, width), generator=g) < 0.05] = vocab + 3
    extra = int(torch.randint(0, 3, (), generator=g))  # rows past the batch: never touched
    num_tokens = torch.randint(0, max_len + 1, (rows + extra,), generator=g, dtype=torch.int32)
    num_tokens[: min(2, rows)] = torch.tensor([0, max_len], dtype=torch.int32)[: min(2, rows)]
    args = dict(
        sampled_token_ids=sampled,
        discard_mask=torch.rand(rows + extra, generator=g) < 0.2,
        token_ids=torch.randint(0, vocab, (rows + extra, max_len), generator=g,
                                dtype=torch.int32),
        num_tokens=num_tokens,
    )
    return {**{name: t.to(device) for name, t in args.items()}, "vocab_size": vocab}


def _cases(count: int) -> list[tuple[int, int, int, int, int]]:
    rng = random.Random()
    shapes = [(1, 1, 8), (64, 5, 1024), (3, 2, 1)]
    shapes += [(rng.randint(1, 80), rng.randint(1, 6), rng.randint(1, 96)) for _ in range(count)]
    return [(rng.randrange(1 << 30), r, w, m, rng.choice([50, 1000, 49152]))
            for r, w, m in shapes]


def _run(fn, args: dict) -> tuple[torch.Tensor, ...]:
    args = {name: t.clone() if isinstance(t, torch.Tensor) else t for name, t in args.items()}
    outputs = fn(**args)
    return (*(t.cpu() for t in outputs), args["token_ids"].cpu())


def _append_by_loop(args: dict, count: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The append rule of the package docstring, one entry at a time."""
    history = args["token_ids"].clone()
    for b in range(valid.shape[0]):
        n = int(args["num_tokens"][b])
        for j in range(valid.shape[1]):
            if j < int(count[b]) and int(valid[b, j]) != -1 and n + j < history.shape[1]:
                history[b, n + j] = valid[b, j]
    return history


@pytest.mark.parametrize("seed,rows,width,max_len,vocab", _cases(6))
def test_reference_matches_vllm_then_the_append_rule(seed, rows, width, max_len, vocab):
    from vllm.v1.spec_decode.ngram_proposer_gpu import NgramProposerGPU

    args = batch(seed, rows, width, max_len, vocab)
    want_next, want_count, want_valid = NgramProposerGPU.update_token_ids_ngram(
        SimpleNamespace(device=torch.device("cpu")), args["sampled_token_ids"].clone(),
        SimpleNamespace(num_reqs=rows, vocab_size=vocab), args["token_ids"].clone(),
        args["num_tokens"].clone(), args["discard_mask"].clone())
    got_next, got_count, got_valid, history = _run(reference, args)
    where = f"seed {seed}, rows {rows}, width {width}, max_len {max_len}"
    assert torch.equal(got_next, want_next), where
    assert torch.equal(got_count, want_count), where
    assert torch.equal(got_valid, want_valid), where
    assert torch.equal(history, _append_by_loop(args, got_count, got_valid)), where
    # Rows past the batch are never written.
    assert torch.equal(history[rows:], args["token_ids"][rows:]), where


def run_both(fn, device: str, seed: int, rows: int, width: int, max_len: int,
             vocab: int) -> None:
    """``fn`` on ``device`` against the reference on the CPU, same inputs."""
    expected = _run(reference, batch(seed, rows, width, max_len, vocab))
    got = _run(fn, batch(seed, rows, width, max_len, vocab, device))
    for name, a, b in zip(("next_token_ids", "valid_count", "valid_sampled", "token_ids"),
                          got, expected):
        assert a.dtype == b.dtype and torch.equal(a, b), (
            f"{device}, seed {seed}, rows {rows}, width {width}, max_len {max_len}: {name}")


CASES = {"ngram_step_update": run_both}


@pytest.mark.parametrize("op,provider", providers_to_compare(FOLDER))
@pytest.mark.parametrize("seed,rows,width,max_len,vocab", _cases(10))
def test_provider_matches_reference(op, provider, seed, rows, width, max_len, vocab):
    CASES[op](kernel(op, provider), device_for(provider), seed, rows, width, max_len, vocab)


@pytest.mark.parametrize("seed,rows,width,max_len,vocab", _cases(3))
def test_triton_kernel_small_shapes(seed, rows, width, max_len, vocab):
    from specdec_plugin.ops.ngram_update.triton import ngram_step_update as triton_kernel

    run_both(triton_kernel, small_shape_device(), seed, rows, min(width, 5), min(max_len, 40),
             vocab)


def test_a_plain_step_appends_each_rows_one_token():
    # k = 0: one sampled token per row; a discarded row (a chunked prefill) appends nothing
    # and takes its history's last token.
    args = dict(sampled_token_ids=torch.tensor([[7], [8], [9]], dtype=torch.int32),
                discard_mask=torch.tensor([False, True, False]),
                token_ids=torch.tensor([[1, 2, 0], [3, 4, 0], [5, 6, 0]], dtype=torch.int32),
                num_tokens=torch.tensor([2, 2, 2], dtype=torch.int32), vocab_size=100)
    next_ids, count, valid, history = _run(reference, args)
    assert next_ids.tolist() == [7, 4, 9] and count.tolist() == [1, 0, 1]
    assert valid.tolist() == [[7], [-1], [9]]
    assert history.tolist() == [[1, 2, 7], [3, 4, 0], [5, 6, 9]]


def test_bad_inputs_name_the_argument():
    args = batch(1, 4, 3, 16, 100)
    with pytest.raises(ContractError, match="discard_mask"):
        reference(**{**args, "discard_mask": args["discard_mask"][:2]})
    with pytest.raises(ContractError, match="token_ids"):
        reference(**{**args, "token_ids": args["token_ids"].float()})
    with pytest.raises(ContractError, match="vocab_size"):
        reference(**{**args, "vocab_size": 0})
