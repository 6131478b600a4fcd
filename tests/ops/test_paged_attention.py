"""Triton paged attention against the pure-torch reference, on fresh random inputs each run.

CPU: the kernels run under Triton's interpreter (see tests/conftest.py) on tiny shapes.
GPU (``-m gpu``): realistic shapes, every dtype, split-KV forced on and off, and a CUDA-graph
capture/replay.
Each case poisons ``out`` with NaN and checks that exactly the real query rows were written.
"""
from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from specdec_plugin.ops.paged_attention import reference  # noqa: E402


def small_shape_device() -> str:
    """Where the tiny-shape tests run: the interpreter on CPU (tests/conftest.py switches it on
    when there is no GPU), else the GPU. Skips if Triton was imported compiled with no GPU."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(tl.sum, InterpretedFunction):
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    pytest.skip("no GPU and Triton is not in interpreter mode (set TRITON_INTERPRET=1 before "
                "anything imports triton)")


def make_case(q_lens, seq_lens, num_q_heads, num_kv_heads, head_size, block_size, dtype, device,
              extra_tokens=3):
    """Random packed queries and a paged cache whose blocks are scattered (a permutation).

    Unused block-table entries are -1 so a kernel that reads past a request's length faults or
    poisons its output. ``query`` is a strided view into a wider qkv-like buffer and has
    ``extra_tokens`` graph-padding rows after the real ones.
    """
    num_seqs = len(q_lens)
    blocks_per_seq = [(s + block_size - 1) // block_size for s in seq_lens]
    max_blocks = max(1, max(blocks_per_seq)) + 1
    num_blocks = sum(blocks_per_seq) + 5
    perm = torch.randperm(num_blocks).tolist()
    block_table = torch.full((num_seqs + 2, max_blocks), -1, dtype=torch.int32)
    for i, n in enumerate(blocks_per_seq):
        block_table[i, :n] = torch.tensor([perm.pop() for _ in range(n)], dtype=torch.int32)

    cache_shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.randn(cache_shape, device=device).to(dtype)
    value_cache = torch.randn(cache_shape, device=device).to(dtype)
    num_tokens = sum(q_lens) + extra_tokens
    qkv = torch.randn(num_tokens, num_q_heads + 2 * num_kv_heads, head_size, device=device).to(dtype)
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


def run_and_check(kernels, case, tol, num_splits=None, host_bound=False):
    out = torch.full_like(case["query"], float("nan"))
    args = {k: v for k, v in case.items()}
    kernels.paged_attention_splits(**args, out=out, num_splits=num_splits, host_bound=host_bound)
    ref = reference_out(case)

    expect_written = ~torch.isnan(ref)
    # Real rows fully written (and finite), padding rows untouched.
    assert torch.equal(~torch.isnan(out), expect_written), (
        f"{(torch.isnan(out) & expect_written).sum().item()} real values not written, "
        f"{(~torch.isnan(out) & ~expect_written).sum().item()} padding values written")
    assert expect_written.any()
    got, want = out[expect_written].float(), ref[expect_written]
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < tol, f"relative error {rel:.3e} >= {tol:.0e}"
    return rel


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
    run_and_check(kernels, case, 1e-3, splits)


@pytest.mark.parametrize("trial", range(3))
def test_small_random_batches(small, trial):
    kernels, device = small
    rng = random.Random()
    q_lens, seq_lens = random_lengths(rng, 4, max_spec=10, long_prefill=24, max_context=60)
    hkv = rng.choice([1, 2])
    case = make_case(q_lens, seq_lens, hkv * rng.choice([1, 2, 4]), hkv, 32,
                     rng.choice([16, 32, 64]), torch.float32, device)
    run_and_check(kernels, case, 1e-3, rng.choice([None, 1, 2, 4]))


def test_small_check_catches_a_wrong_scale(small):
    """The comparison itself can fail: a scale off by 10% must be caught."""
    kernels, device = small
    case = make_case([1, 4], [20, 30], 4, 2, 32, 16, torch.float32, device)
    case["scale"] *= 1.1
    out = torch.full_like(case["query"], float("nan"))
    kernels.paged_attention_splits(**case, out=out, num_splits=None)
    case["scale"] /= 1.1
    ref = reference_out(case)
    written = ~torch.isnan(ref)
    assert ((out[written] - ref[written]).norm() / ref[written].norm()).item() > 1e-3


# ---------------------------------------------------------------------------------------------
# GPU: compiled kernels, realistic shapes.

def _gpu_kernels():
    from specdec_plugin.ops.paged_attention import triton as kernels
    return kernels


GPU_TOL = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-3}


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
    run_and_check(_gpu_kernels(), case, GPU_TOL[dtype], splits)


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,d", [(32, 32, 128), (16, 2, 64), (8, 8, 64), (28, 4, 128), (12, 4, 96)])
@pytest.mark.parametrize("splits", [None, 8])
def test_gpu_head_configs(hq, hkv, d, splits):
    rng = random.Random()
    q_lens, seq_lens = random_lengths(rng, 6, max_spec=10, long_prefill=300, max_context=2000)
    case = make_case(q_lens, seq_lens, hq, hkv, d, rng.choice([16, 32, 64]), torch.bfloat16, "cuda")
    run_and_check(_gpu_kernels(), case, 1e-2, splits)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("q_len", [1, 5])
def test_gpu_host_bound_launch(batch, q_len):
    """Drafting launches (``host_bound``) split only long contexts; short or long, the result
    matches the reference."""
    seq_lens = [random.randint(q_len, 600) for _ in range(batch - 1)] + [random.randint(2500, 8000)]
    case = make_case([q_len] * batch, seq_lens, 32, 8, 128, 16, torch.bfloat16, "cuda")
    run_and_check(_gpu_kernels(), case, 1e-2, host_bound=True)


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
        ref = reference_out(new)
        written = ~torch.isnan(ref)
        assert torch.equal(~torch.isnan(out), written)
        rel = ((out[written].float() - ref[written]).norm() / ref[written].norm()).item()
        assert rel < 1e-2, rel


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
