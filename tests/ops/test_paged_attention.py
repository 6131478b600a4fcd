"""Paged attention (``ops/paged_attention``): every registered provider against the pure-torch
reference, on seeded random inputs, element by element.

- Registry-driven: each provider the registry lists for ``paged_attention`` (and the workspace
  reservation that fixes its split plan) runs decode, 1+K verification, prefill, chunked
  prefill, padding requests and GQA over scattered blocks; C++ on the CPU, Triton on a GPU.
- Triton's small shapes also run under its interpreter on CPU; on a GPU (``-m gpu``): realistic
  shapes, every dtype, split-KV forced on and off, and a CUDA-graph capture/replay.
- ``out`` starts as NaN and has graph-padding rows after the real ones: exactly the real query
  rows must be written, and each element must match the fp32 reference (``assert_close``).
- The split plan (so the summation order) is a function of the arguments only.
- Contract: every provider rejects mismatched shapes and dtypes; providers on host memory also
  reject lengths and block ids out of range; an empty batch writes nothing.
"""
from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from specdec_plugin.ops.contract import ContractError  # noqa: E402
from specdec_plugin.ops.paged_attention import reference  # noqa: E402
from tests.ops.providers import (  # noqa: E402
    device_for,
    every_provider,
    generator,
    host_providers,
    kernel,
    providers_to_compare,
    small_shape_device,
)

FOLDER = "paged_attention"
# Element-wise, against the fp32 reference. Half precision: the kernels round the softmax
# weights to the input dtype before the P @ V product, and the output once more.
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float16: dict(rtol=5e-3, atol=5e-3),
       torch.bfloat16: dict(rtol=2e-2, atol=3e-2)}


def make_case(q_lens, seq_lens, num_q_heads, num_kv_heads, head_size, block_size, dtype, device,
              extra_tokens=3, generator=None):
    """Random packed queries and a paged cache whose blocks are scattered (a permutation).

    Unused block-table entries are -1 so a kernel that reads past a request's length faults or
    poisons its output. ``query`` is a strided view into a wider qkv-like buffer and has
    ``extra_tokens`` graph-padding rows after the real ones. With a (CPU) ``generator`` the
    case is drawn from it on the CPU, then moved, so every device sees the same numbers.
    """
    num_seqs = len(q_lens)
    blocks_per_seq = [(s + block_size - 1) // block_size for s in seq_lens]
    max_blocks = max(1, max(blocks_per_seq)) + 1
    num_blocks = sum(blocks_per_seq) + 5
    perm = torch.randperm(num_blocks, generator=generator).tolist()
    block_table = torch.full((num_seqs + 2, max_blocks), -1, dtype=torch.int32)
    for i, n in enumerate(blocks_per_seq):
        block_table[i, :n] = torch.tensor([perm.pop() for _ in range(n)], dtype=torch.int32)

    def randn(*shape):
        if generator is None:
            return torch.randn(*shape, device=device).to(dtype)
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    cache_shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = randn(*cache_shape)
    value_cache = randn(*cache_shape)
    num_tokens = sum(q_lens) + extra_tokens
    qkv = randn(num_tokens, num_q_heads + 2 * num_kv_heads, head_size)
    query = qkv[:, :num_q_heads]
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    return dict(
        query=query, key_cache=key_cache, value_cache=value_cache,
        block_table=block_table.to(device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        scale=head_size ** -0.5,
        max_query_len=max(q_lens), max_seq_len=max(seq_lens),
    )


def reference_out(case):
    """fp32 reference, one request at a time (bounds memory for long prefills)."""
    out = torch.full(case["query"].shape, float("nan"), dtype=torch.float32,
                     device=case["query"].device)
    starts = case["query_start_loc"].tolist()
    seq_lens = case["seq_lens"].tolist()
    for i, seq_len in enumerate(seq_lens):
        q_len = starts[i + 1] - starts[i]
        if q_len == 0:
            continue
        reference.paged_attention(
            case["query"][starts[i]: starts[i + 1]].float(), case["key_cache"].float(),
            case["value_cache"].float(), case["block_table"][i: i + 1],
            torch.tensor([0, q_len], dtype=torch.int32, device=out.device),
            case["seq_lens"][i: i + 1], case["scale"], out[starts[i]: starts[i + 1]],
            q_len, seq_len,
        )
    return out


def check_written(out, case):
    """``out`` (NaN where unwritten) against the fp32 reference: the real query rows are all
    written and finite, padding rows untouched, and every element within TOL."""
    ref = reference_out(case)
    expect_written = ~torch.isnan(ref)
    assert torch.equal(~torch.isnan(out), expect_written), (
        f"{(torch.isnan(out) & expect_written).sum().item()} real values not written, "
        f"{(~torch.isnan(out) & ~expect_written).sum().item()} padding values written")
    assert expect_written.any()
    torch.testing.assert_close(out[expect_written].float(), ref[expect_written],
                               **TOL[case["query"].dtype])


def run_and_check(kernels, case, num_splits=None, host_bound=False, plan_seq_len=0):
    out = torch.full_like(case["query"], float("nan"))
    kernels.paged_attention_splits(**case, out=out, num_splits=num_splits, host_bound=host_bound,
                                   plan_seq_len=plan_seq_len)
    check_written(out, case)


def random_lengths(rng, num_seqs, max_spec, long_prefill, max_context):
    """q_lens mixing padding (0), decode (1), verification (1+K) and prefills, seq_len >= q_len."""
    q_lens, seq_lens = [], []
    for _ in range(num_seqs):
        kind = rng.choice(["pad", "decode", "verify", "prefill", "chunked"])
        if kind == "pad":
            q, ctx = 0, 0
        elif kind == "decode":
            q, ctx = 1, rng.randint(0, max_context)
        elif kind == "verify":
            q, ctx = 1 + rng.randint(1, max_spec), rng.randint(0, max_context)
        elif kind == "prefill":
            q, ctx = rng.randint(1, long_prefill), 0
        else:
            q, ctx = rng.randint(2, long_prefill), rng.randint(1, max_context)
        q_lens.append(q)
        seq_lens.append(q + ctx)
    if max(q_lens) == 0:
        q_lens[0], seq_lens[0] = 1, 1
    return q_lens, seq_lens


# ---------------------------------------------------------------------------------------------
# Tiny shapes: Triton's interpreter on CPU, compiled on a GPU.

@pytest.fixture(scope="module")
def small():
    from specdec_plugin.ops.paged_attention import triton as kernels

    return kernels, small_shape_device()


INTERPRETER_CASES = [
    # (q_lens, seq_lens, Hq, Hkv, D, block_size, num_splits)
    ([1, 3, 0, 5], [10, 40, 0, 5], 4, 2, 32, 16, None),            # decode, verify, pad, prefill
    ([1, 3, 0, 5], [10, 40, 0, 5], 4, 2, 32, 16, 4),               # same, split-KV
    ([11, 11, 0], [70, 11, 0], 4, 1, 32, 32, 2),                  # 1+K=11 verification, Hq/Hkv=4
    ([40, 1, 6], [90, 33, 6], 2, 2, 32, 64, None),                 # long chunked prefill, MHA
    ([0, 0, 7], [0, 0, 130], 6, 2, 32, 16, 4),                     # padding first, group of 3
    ([3, 1], [20, 9], 2, 1, 24, 16, 2),                            # head size not a power of 2
    ([2, 1, 4], [70, 90, 33], 4, 2, 32, 16, 3),                    # a split count not a power of 2
    ([1, 5], [300, 200], 4, 2, 32, 16, 16),                        # the most splits the merge reads
]


@pytest.mark.parametrize("q_lens,seq_lens,hq,hkv,d,bs,splits", INTERPRETER_CASES)
def test_small_fixed_shapes(small, q_lens, seq_lens, hq, hkv, d, bs, splits):
    kernels, device = small
    case = make_case(q_lens, seq_lens, hq, hkv, d, bs, torch.float32, device)
    run_and_check(kernels, case, splits)


@pytest.mark.parametrize("trial", range(3))
def test_small_random_batches(small, trial):
    kernels, device = small
    rng = random.Random()
    q_lens, seq_lens = random_lengths(rng, 4, max_spec=10, long_prefill=24, max_context=60)
    hkv = rng.choice([1, 2])
    case = make_case(q_lens, seq_lens, hkv * rng.choice([1, 2, 4]), hkv, 32,
                     rng.choice([16, 32, 64]), torch.float32, device)
    run_and_check(kernels, case, rng.choice([None, 1, 2, 4]))


def test_small_check_catches_a_wrong_scale(small):
    """The comparison itself can fail: a scale off by 10% must be caught."""
    kernels, device = small
    case = make_case([1, 4], [20, 30], 4, 2, 32, 16, torch.float32, device)
    out = torch.full_like(case["query"], float("nan"))
    kernels.paged_attention_splits(**{**case, "scale": case["scale"] * 1.1}, out=out,
                                   num_splits=None)
    with pytest.raises(AssertionError):
        check_written(out, case)


def test_split_plan_depends_only_on_the_arguments(small, monkeypatch):
    """The split count (and so the summation order) follows from the launch's own arguments,
    ``plan_seq_len`` included: a workspace reserved meanwhile for a longer context (another
    layer group, another engine in the process) changes neither the plan nor a bit of ``out``.
    The GPU's SM count is fixed here so that the interpreter plans splits as an H100 would."""
    kernels, device = small
    monkeypatch.setattr(kernels, "_device_index", lambda device: 0)
    monkeypatch.setattr(kernels, "_sm_count", lambda device_index: 132)
    plans = []
    launch_plan = kernels._launch_plan

    def recorded(*args):
        plans.append(launch_plan(*args))
        return plans[-1]

    monkeypatch.setattr(kernels, "_launch_plan", recorded)
    case = make_case([1, 1], [40, 300], 4, 2, 32, 16, torch.float32, device,
                     generator=generator(5))

    def run(plan_seq_len):
        out = torch.full_like(case["query"], float("nan"))
        kernels.paged_attention(**case, out=out, plan_seq_len=plan_seq_len)
        return out, plans[-1].num_splits

    planned, splits = run(4096)
    assert kernels.reserve_workspace(4, (1,), 4, 2, 32, 1 << 20, torch.float32,
                                     torch.device(device)) == 1 << 20
    again, splits_again = run(4096)
    assert splits > 1 and splits_again == splits
    assert torch.equal(planned.nan_to_num(), again.nan_to_num())
    unplanned, unplanned_splits = run(0)  # plans for this batch's max_seq_len alone
    assert unplanned_splits < splits
    check_written(unplanned, case)
    check_written(planned, case)


# ---------------------------------------------------------------------------------------------
# Every registered provider against the reference (the registry decides which run).

def paged_attention_case(attention, provider, device, dtype, seed):
    """One seeded random batch through ``attention``; returns (out, case)."""
    rng = random.Random(seed)
    q_lens, seq_lens = random_lengths(rng, rng.randint(1, 6), max_spec=8, long_prefill=40,
                                      max_context=200)
    hkv = rng.choice([1, 3])
    case = make_case(q_lens, seq_lens, hkv * rng.choice([1, 3]), hkv, rng.choice([64, 40]),
                     rng.choice([16, 32]), dtype, device, generator=generator(seed))
    out = torch.full_like(case["query"], float("nan"))
    attention(**case, out=out)
    return out, case


def workspace_case(reserve, provider, device, dtype, seed):
    """The reservation's plan handed to the same provider's attention, as the metadata builder
    does: every launch planned for the longest context the engine allows."""
    rng = random.Random(seed)
    batch, k = rng.randint(1, 6), rng.randint(1, 4)
    case = make_case([1 + k] * batch, [rng.randint(1 + k, 300) for _ in range(batch)], 8, 2, 64,
                     16, dtype, device, generator=generator(seed))
    plan_seq_len = reserve(16, (1, 1 + k), 8, 2, 64, 4096, dtype, torch.device(device))
    assert plan_seq_len == 4096
    out = torch.full_like(case["query"], float("nan"))
    kernel("paged_attention", provider)(**case, out=out, plan_seq_len=plan_seq_len)
    return out, case


def write_kv_case(fused, provider, device, dtype, seed):
    from tests.ops.test_paged_attention_write_kv import fused_case  # it imports this module

    return fused_case(fused, provider, device, dtype, seed)


CASES = {"paged_attention": paged_attention_case, "paged_attention_workspace": workspace_case,
         "paged_attention_write_kv": write_kv_case}


@pytest.mark.parametrize("op,provider", providers_to_compare(FOLDER))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", range(4))
def test_provider_matches_reference(op, provider, dtype, seed):
    out, case = CASES[op](kernel(op, provider), provider, device_for(provider), dtype, seed)
    check_written(out, case)


def test_smollm2_decode_and_verify_shapes_cpp():
    """The shapes the CPU engine runs: 9 query / 3 KV heads of 64, blocks of 16, batch 8,
    1+K=4, with a padding request."""
    case = make_case([1, 4, 1, 4, 1, 1, 4, 0], [37, 120, 5, 64, 300, 17, 4, 0], 9, 3, 64, 16,
                     torch.float32, "cpu", generator=generator(11))
    out = torch.full_like(case["query"], float("nan"))
    kernel("paged_attention", "cpp")(**case, out=out)
    check_written(out, case)


@pytest.mark.parametrize("vectorized", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpp_kernels_fresh_inputs_and_row_invariance(vectorized, dtype):
    """Both C++ kernels (AVX-512 where the CPU has it, and the scalar one) on fresh random
    shapes: close to the reference, and a query row bit-identical whether it runs alone (a
    decode) or as one of 1+K rows of its request beside other requests (a verification)."""
    import random as rnd

    from specdec_plugin import _C

    seed = rnd.randrange(1 << 30)
    rng = rnd.Random(seed)
    head = rng.choice([64, 128, 80, 40])
    num_seqs = rng.randint(1, 4)
    q_lens = [rng.randint(1, 6) for _ in range(num_seqs)]
    seq_lens = [q + rng.randint(0, 300) for q in q_lens]
    case = make_case(q_lens, seq_lens, 6, 2, head, 16, dtype, "cpu", generator=generator(seed))
    args = [case[k] for k in ("query", "key_cache", "value_cache", "block_table",
                              "query_start_loc", "seq_lens")]
    out = torch.full_like(case["query"], float("nan"))
    _C.cpu_paged_attention(*args, case["scale"], out, vectorized)
    check_written(out, case)
    s = rng.randrange(num_seqs)
    start, q_len = case["query_start_loc"][s].item(), q_lens[s]
    for i in range(q_len):  # row i of request s alone, its keys cut at its own position
        row = case["query"][start + i: start + i + 1]
        alone = torch.full_like(row, float("nan"))
        _C.cpu_paged_attention(row, *args[1:3], case["block_table"][s: s + 1],
                               torch.tensor([0, 1], dtype=torch.int32),
                               torch.tensor([seq_lens[s] - q_len + i + 1], dtype=torch.int32),
                               case["scale"], alone, vectorized)
        assert torch.equal(alone[0], out[start + i]), f"seed {seed} row {i}"


def test_cpp_check_catches_a_wrong_scale():
    case = make_case([1, 4], [20, 30], 4, 2, 64, 16, torch.float32, "cpu")
    out = torch.full_like(case["query"], float("nan"))
    kernel("paged_attention", "cpp")(**{**case, "scale": case["scale"] * 1.1}, out=out)
    with pytest.raises(AssertionError):
        check_written(out, case)


# ---------------------------------------------------------------------------------------------
# The contract's edges, for every provider (the reference included).

ATTENTION_PROVIDERS = [p for p in every_provider(FOLDER) if p.values[0] == "paged_attention"]


def _contract_case(provider):
    return make_case([1, 3], [20, 40], 4, 2, 32, 16, torch.float32, device_for(provider),
                     generator=generator(2))


def _rejects(attention, case, out, bad: dict) -> None:
    for what, change in bad.items():
        try:
            attention(**{**case, "out": out, **change})
        except ContractError:
            continue
        pytest.fail(f"accepted: {what}")
    assert torch.isnan(out).all()  # rejected before anything was written


@pytest.mark.parametrize("op,provider", ATTENTION_PROVIDERS)
def test_contract_rejects_mismatched_inputs(op, provider):
    case = _contract_case(provider)
    out = torch.full_like(case["query"], float("nan"))
    _rejects(kernel(op, provider), case, out, {
        "out shape": dict(out=out[:, :2]),
        "out dtype": dict(out=out.double()),
        "cache dtype": dict(key_cache=case["key_cache"].double(),
                            value_cache=case["value_cache"].double()),
        "head size": dict(query=case["query"][..., :16], out=out[..., :16]),
        "index dtype": dict(seq_lens=case["seq_lens"].long()),
        "seq_lens longer than query_start_loc":
            dict(query_start_loc=case["query_start_loc"][:2]),
    })


def _head_dim_strided(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its shape and values but no unit stride in the last dimension."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


@pytest.mark.parametrize("op,provider", ATTENTION_PROVIDERS)
def test_contract_rejects_a_bad_input_right_after_a_good_one(op, provider):
    """The structural checks are skipped for tensors of the structure that passed last
    (validate.py: PassedStructure): each bad input, right after a good call, must still fail,
    and fail again on a repeat (a failing structure is never remembered)."""
    attention, case = kernel(op, provider), _contract_case(provider)
    nan_out = lambda: torch.full_like(case["query"], float("nan"))  # noqa: E731
    out = nan_out()
    bad = {
        "out shape": dict(out=out[:, :2]),
        "out dtype": dict(out=out.double()),
        "cache dtype": dict(key_cache=case["key_cache"].double(),
                            value_cache=case["value_cache"].double()),
        "value cache shape": dict(value_cache=case["value_cache"][:-1]),
        "head size": dict(query=case["query"][..., :16], out=out[..., :16]),
        "query head stride": dict(query=_head_dim_strided(case["query"])),
        "out head stride": dict(out=_head_dim_strided(out)),
        "cache head stride": dict(key_cache=_head_dim_strided(case["key_cache"])),
        "index dtype": dict(seq_lens=case["seq_lens"].long()),
        "block_table 1-D": dict(block_table=case["block_table"][0]),
        "seq_lens longer than query_start_loc":
            dict(query_start_loc=case["query_start_loc"][:2]),
        # Same tensors as the good call: only the integer arguments are wrong.
        "max_query_len past the query rows": dict(max_query_len=case["query"].shape[0] + 1),
        "negative max_seq_len": dict(max_seq_len=-1),
    }
    for what, change in bad.items():
        attention(**case, out=nan_out())
        for _ in range(2):
            try:
                attention(**{**case, "out": out, **change})
            except ContractError:
                continue
            pytest.fail(f"accepted after a good call: {what}")
    assert torch.isnan(out).all()  # rejected before anything was written
    good = nan_out()
    attention(**case, out=good)
    check_written(good, case)


@pytest.mark.parametrize("op,provider", [p for p in host_providers(FOLDER)
                                         if p.values[0] == "paged_attention"])
def test_contract_rejects_out_of_range_lengths_and_blocks(op, provider):
    attention, case = kernel(op, provider), _contract_case(provider)
    out = torch.full_like(case["query"], float("nan"))
    num_blocks = case["key_cache"].shape[0]
    read = case["block_table"].clone()
    read[1, 1] = num_blocks  # request 1 reads its second block (seq_len 40 > 16)
    unread = case["block_table"].clone()
    unread[1, 3] = num_blocks  # past request 1's blocks: never read, so allowed
    _rejects(attention, case, out, {
        "block id past the cache": dict(block_table=read),
        "q_len > seq_len": dict(seq_lens=torch.tensor([20, 2], dtype=torch.int32)),
        "seq_len past the block table": dict(
            seq_lens=torch.tensor([20, 16 * case["block_table"].shape[1] + 1], dtype=torch.int32),
            max_seq_len=16 * case["block_table"].shape[1] + 1),
        "seq_len > max_seq_len": dict(max_seq_len=39),
        "q_len > max_query_len": dict(max_query_len=2),
        "query rows past the tensor":
            dict(query_start_loc=torch.tensor([0, 1, 99], dtype=torch.int32)),
    })
    attention(**{**case, "block_table": unread, "out": out})
    check_written(out, case)
    # The same tensors again after an in-place write: checked again, not remembered as good.
    attention(**case, out=torch.full_like(out, float("nan")))
    case["block_table"][1, 1] = num_blocks
    _rejects(attention, case, torch.full_like(out, float("nan")), {"block written in place": {}})


@pytest.mark.parametrize("op,provider", [p for p in host_providers(FOLDER)
                                         if p.values[0] == "paged_attention"])
def test_inference_tensors_are_checked_on_every_call(op, provider):
    """Tensors made under inference_mode keep no version counter, so the once-per-step memo
    cannot tell an in-place write: their values are read on every call."""
    attention = kernel(op, provider)
    with torch.inference_mode():
        case = _contract_case(provider)
        out = torch.full_like(case["query"], float("nan"))
        attention(**case, out=out)
        check_written(out, case)
        case["block_table"][1, 1] = case["key_cache"].shape[0]
        _rejects(attention, case, torch.full_like(out, float("nan")),
                 {"block written in place": {}})


@pytest.mark.parametrize("op,provider", ATTENTION_PROVIDERS)
def test_empty_batch_writes_nothing(op, provider):
    case = _contract_case(provider)
    out = torch.full_like(case["query"], float("nan"))
    empty = {**case, "seq_lens": case["seq_lens"][:0],
             "query_start_loc": case["query_start_loc"][:1], "max_query_len": 0,
             "max_seq_len": 0}
    kernel(op, provider)(**empty, out=out)
    assert torch.isnan(out).all()


# ---------------------------------------------------------------------------------------------
# GPU: compiled kernels, realistic shapes.

def _gpu_kernels():
    from specdec_plugin.ops.paged_attention import triton as kernels
    return kernels


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("scenario", ["decode", "verify", "mixed", "prefill"])
@pytest.mark.parametrize("splits", [None, 1])
def test_gpu_llama_gqa(dtype, scenario, splits):
    rng = random.Random()
    batch = 16
    if scenario == "decode":
        q_lens = [1] * batch
        seq_lens = [rng.randint(1, 4096) for _ in range(batch)]
    elif scenario == "verify":
        q_lens = [1 + rng.randint(1, 10) for _ in range(batch)]
        seq_lens = [q + rng.randint(0, 4000) for q in q_lens]
    elif scenario == "mixed":
        q_lens, seq_lens = random_lengths(rng, batch, max_spec=10, long_prefill=1024,
                                          max_context=3000)
    else:
        q_lens = [rng.randint(1, 2048) for _ in range(batch // 4)]
        seq_lens = list(q_lens)
    case = make_case(q_lens, seq_lens, 32, 8, 128, rng.choice([16, 32, 64]), dtype, "cuda")
    run_and_check(_gpu_kernels(), case, splits)


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,d", [(32, 32, 128), (16, 2, 64), (8, 8, 64), (28, 4, 128), (12, 4, 96)])
@pytest.mark.parametrize("splits", [None, 8])
def test_gpu_head_configs(hq, hkv, d, splits):
    rng = random.Random()
    q_lens, seq_lens = random_lengths(rng, 6, max_spec=10, long_prefill=300, max_context=2000)
    case = make_case(q_lens, seq_lens, hq, hkv, d, rng.choice([16, 32, 64]), torch.bfloat16, "cuda")
    run_and_check(_gpu_kernels(), case, splits)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("q_len", [1, 5])
def test_gpu_host_bound_launch(batch, q_len):
    """Drafting launches (``host_bound``) split only long contexts; short or long, the result
    matches the reference."""
    seq_lens = [random.randint(q_len, 600) for _ in range(batch - 1)] + [random.randint(2500, 8000)]
    case = make_case([q_len] * batch, seq_lens, 32, 8, 128, 16, torch.bfloat16, "cuda")
    run_and_check(_gpu_kernels(), case, host_bound=True)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay():
    """Captured once, replayed with new lengths and data: no host sync, no stale workspace."""
    kernels = _gpu_kernels()
    batch, spec = 4, 4
    case = make_case([1 + spec] * batch, [3000] * batch, 32, 8, 128, 16, torch.bfloat16, "cuda")
    static = {k: v for k, v in case.items()}
    static["max_seq_len"] = 4096  # what a capture would use: an upper bound
    out = torch.full_like(case["query"], float("nan"))
    kernels.paged_attention(**static, out=out)  # warm-up: compiles, sizes the workspace
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernels.paged_attention(**static, out=out)

    for trial in range(2):
        q_lens = [1 + spec] * (batch - 1) + [0]  # last slot is graph padding
        seq_lens = [random.randint(1 + spec, 3000) for _ in range(batch - 1)] + [0]
        new = make_case(q_lens, seq_lens, 32, 8, 128, 16, torch.bfloat16, "cuda",
                        extra_tokens=1 + spec + 3)
        # Copy the new step into the captured tensors, as a model runner would.
        static["query"].copy_(new["query"])
        static["key_cache"].zero_()[: new["key_cache"].shape[0]].copy_(new["key_cache"])
        static["value_cache"].zero_()[: new["value_cache"].shape[0]].copy_(new["value_cache"])
        static["block_table"].fill_(-1)[:, : new["block_table"].shape[1]].copy_(new["block_table"])
        static["query_start_loc"].copy_(new["query_start_loc"])
        static["seq_lens"].copy_(new["seq_lens"])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_written(out, new)


@pytest.mark.gpu
def test_gpu_serving_mix_compiles_few_variants():
    """A serving mix (decode and drafting at batch 1-16, verification of 2..1+K tokens, prefills
    of many lengths, every split count) compiles at most 6 attention variants (query tile 1, 8,
    largest; split or not) and 1 merge variant. A new variant met mid-serving stalls that step
    for a compile, which is what this bounds; vLLM's own attention compiles nothing at run time.
    """
    kernels = _gpu_kernels()
    rng = random.Random()
    device = torch.cuda.current_device()
    caches = [kernels._attention_tile_kernel.device_caches[device][0],
              kernels._merge_splits_kernel.device_caches[device][0]]
    for cache in caches:
        cache.clear()  # forget what earlier tests compiled (Triton's disk cache makes this cheap)

    def run(case):
        # An engine's block table has one width; make_case's varies with the lengths, and its
        # row stride would be specialised (multiple of 16 or not) into extra variants.
        table = torch.full((case["block_table"].shape[0], 80), -1, dtype=torch.int32,
                           device="cuda")
        table[:, : case["block_table"].shape[1]] = case["block_table"]
        case["block_table"] = table
        kernels.paged_attention(**case, out=torch.empty_like(case["query"]))

    for batch in (1, 2, 3, 7, 15, 16):
        for q in (1, 2, 3, 4, 5):
            seq_lens = [rng.randint(q, 1000) for _ in range(batch)]
            run(make_case([q] * batch, seq_lens, 32, 8, 128, 16, torch.bfloat16, "cuda"))
    for q in (9, 16, 17, 100, 192):
        run(make_case([q, 1], [q, 400], 32, 8, 128, 16, torch.bfloat16, "cuda"))
    torch.cuda.synchronize()
    attention, merge = (len(cache) for cache in caches)
    assert 1 <= attention <= 6 and merge == 1, (attention, merge)
