"""``paged_attention_write_kv``: the query tokens' KV write and paged attention in one op.

Every provider the registry lists runs through test_paged_attention.py's comparison
(``fused_case``); here the Triton kernel's small shapes are checked against the two separate
reference ops run in order (``reshape_and_cache``, then ``paged_attention``): the output rows
and both caches must match. The new tokens' slots are those their positions map to through the
block table (what vLLM's slot mapping holds), some set to -1 (padding: not written). The
cache's new-token slots start as random values, so attention that read them before they were
written would differ from the reference. Triton runs its small shapes under the interpreter on
CPU (compiled on a GPU), with the KV split on and off: each split's programs write the new
keys of their own range before reading them.
"""
from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from specdec_plugin.ops.contract import ContractError  # noqa: E402
from specdec_plugin.ops.paged_attention import reference  # noqa: E402
from specdec_plugin.ops.reshape_and_cache.reference import reshape_and_cache  # noqa: E402
from tests.ops.providers import kernel, small_shape_device  # noqa: E402
from tests.ops.test_paged_attention import TOL, make_case, random_lengths  # noqa: E402

OP = "paged_attention_write_kv"


def with_new_kv(case: dict, q_lens: list[int], padded_slots: float = 0.2) -> dict:
    """``case`` plus this step's key/value rows and the slot of every query token (its
    position through the block table; a share of them -1), as the fused op takes them."""
    block_size = case["key_cache"].shape[1]
    query, device = case["query"], case["query"].device
    num_tokens, kv_heads, head = query.shape[0], case["key_cache"].shape[2], query.shape[2]
    key = torch.randn(num_tokens, kv_heads, head, device=device).to(query.dtype)
    value = torch.randn(num_tokens, kv_heads, head, device=device).to(query.dtype)
    slots = torch.full((num_tokens,), -1, dtype=torch.int64)
    table = case["block_table"].cpu()
    token = 0
    for i, (q_len, seq_len) in enumerate(zip(q_lens, case["seq_lens"].tolist())):
        for j in range(q_len):
            pos = seq_len - q_len + j
            if random.random() >= padded_slots:
                slots[token] = int(table[i, pos // block_size]) * block_size + pos % block_size
            token += 1
    return {**case, "key": key, "value": value, "slot_mapping": slots.to(device)}


def written_caches(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of the caches with the real query tokens' K/V written by the reference
    ``reshape_and_cache``: what the fused op must leave in them."""
    key_cache, value_cache = case["key_cache"].clone(), case["value_cache"].clone()
    real = int(case["query_start_loc"][-1])
    reshape_and_cache(case["key"][:real], case["value"][:real], key_cache, value_cache,
                      case["slot_mapping"][:real])
    return key_cache, value_cache


def separate_ops(case: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference order on copies of the caches, in fp32: the KV write, then attention."""
    key_cache, value_cache = (cache.float() for cache in written_caches(case))
    out = torch.zeros(case["query"].shape, dtype=torch.float32, device=case["query"].device)
    reference.paged_attention(case["query"].float(), key_cache, value_cache,
                              case["block_table"], case["query_start_loc"], case["seq_lens"],
                              case["scale"], out, case["max_query_len"], case["max_seq_len"])
    return out, key_cache, value_cache


def check_against_separate_ops(case: dict, run) -> None:
    expected, key_cache, value_cache = separate_ops(case)
    out = torch.full_like(case["query"], float("nan"))
    got_key, got_value = case["key_cache"].clone(), case["value_cache"].clone()
    run({**case, "key_cache": got_key, "value_cache": got_value}, out)
    real = int(case["query_start_loc"][-1])
    tol = TOL[case["query"].dtype]
    torch.testing.assert_close(out[:real].float(), expected[:real], **tol)
    assert torch.isnan(out[real:]).all()  # graph-padding rows untouched
    # The caches are copies of the new rows: exact.
    torch.testing.assert_close(got_key.float(), key_cache, rtol=0, atol=0)
    torch.testing.assert_close(got_value.float(), value_cache, rtol=0, atol=0)


CASES = [
    # (q_lens, seq_lens, Hq, Hkv, D, block_size, num_splits)
    ([1, 3, 0, 5], [10, 40, 0, 5], 4, 2, 32, 16, None),   # decode, verify, pad, prefill
    ([1, 3, 0, 5], [10, 40, 0, 5], 4, 2, 32, 16, 4),      # same, split-KV
    ([5, 5], [33, 17], 4, 1, 32, 16, 2),                  # 1+K=5 at a split boundary
    ([11, 2], [70, 40], 2, 2, 32, 32, 3),                 # two query tiles of 8, split
    ([2, 1, 4], [70, 90, 33], 4, 2, 24, 16, None),        # head size not a power of 2
]


@pytest.mark.parametrize("q_lens,seq_lens,hq,hkv,d,bs,splits", CASES)
def test_triton_small_shapes(q_lens, seq_lens, hq, hkv, d, bs, splits):
    from specdec_plugin.ops.paged_attention import triton as kernels

    case = with_new_kv(make_case(list(q_lens), list(seq_lens), hq, hkv, d, bs, torch.float32,
                                 small_shape_device()), q_lens)
    names = ("query", "key_cache", "value_cache", "block_table", "query_start_loc", "seq_lens",
             "scale")

    def run(case, out):
        kernels.paged_attention_splits(*(case[n] for n in names), out, case["max_query_len"],
                                       case["max_seq_len"], splits,
                                       new_kv=(case["key"], case["value"],
                                               case["slot_mapping"]))

    check_against_separate_ops(case, run)


def fused_case(fused, provider, device, dtype, seed):
    """One random batch through ``fused`` for test_paged_attention.py's registry-driven
    comparison (its CASES): the caches must equal the reference write exactly here, and the
    case returned holds those expected caches, so that the attention compared there is the
    reference's over what should have been written."""
    rng = random.Random(seed)
    q_lens, seq_lens = random_lengths(rng, rng.randint(1, 6), max_spec=6, long_prefill=40,
                                      max_context=300)
    hkv = rng.choice([1, 2, 4])
    case = with_new_kv(make_case(q_lens, seq_lens, hkv * rng.choice([1, 4]), hkv, 64,
                                 rng.choice([16, 32]), dtype, device), q_lens)
    expected_key, expected_value = written_caches(case)
    out = torch.full_like(case["query"], float("nan"))
    fused(**case, out=out)
    assert torch.equal(case["key_cache"], expected_key)
    assert torch.equal(case["value_cache"], expected_value)
    return out, {name: value for name, value in case.items()
                 if name not in ("key", "value", "slot_mapping")}


def test_the_check_catches_a_missed_write():
    """The comparison can fail: the attention alone (no KV write) must not pass it."""
    case = with_new_kv(make_case([3, 1], [20, 9], 2, 1, 32, 16, torch.float32, "cpu"), [3, 1],
                       padded_slots=0.0)
    with pytest.raises(AssertionError):
        check_against_separate_ops(case, lambda case, out: reference.paged_attention(
            case["query"], case["key_cache"], case["value_cache"], case["block_table"],
            case["query_start_loc"], case["seq_lens"], case["scale"], out,
            case["max_query_len"], case["max_seq_len"]))


@pytest.mark.parametrize("provider", ["torch"])
def test_too_few_slots_are_refused(provider):
    case = with_new_kv(make_case([3, 2], [20, 9], 2, 1, 32, 16, torch.float32, "cpu"), [3, 2])
    case["slot_mapping"] = case["slot_mapping"][:4]
    out = torch.empty_like(case["query"])
    with pytest.raises(ContractError, match="slot"):
        kernel(OP, provider)(**case, out=out)


@pytest.mark.parametrize("provider,dtype", [("torch", torch.float32), ("torch", torch.bfloat16),
                                            ("triton", torch.float32)])
def test_random_batches_on_this_host(provider, dtype):
    """``fused_case`` on fresh random batches here: the torch reference, and Triton under its
    interpreter (on a GPU host, compiled), against the separate ops. Triton in float32 only:
    its interpreter mishandles bfloat16 (the plain attention kernel too; checked here on
    2026-12-02); test_paged_attention.py runs every dtype on a GPU."""
    from tests.ops.test_paged_attention import check_written

    device = small_shape_device() if provider == "triton" else "cpu"
    out, case = fused_case(kernel(OP, provider), provider, device, dtype,
                           random.randrange(1 << 30))
    check_written(out, case)
