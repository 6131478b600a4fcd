"""The ``cpp`` linear provider's own contract (csrc/cpu_linear_packed.cpp, ops/linear/cpp.py):
bfloat16 (or float32) weights widened to float32, float32 activations and accumulation, and
every output element reduced in one fixed order, so that a row's result never depends on the
other rows of the call. tests/ops/test_linear.py compares it with the package's rounding
reference like every provider; this file holds it to its stricter promises:

- against ``widened_reference`` (the same math in torch) to float32 rounding, on fresh random
  inputs every run (the seed is in the failure message), with bfloat16-exact weights as a
  bfloat16 checkpoint has them, odd shapes (N not a multiple of 16 or 32, K odd) and M = 0;
- bit-exact row invariance: row i alone (M = 1) equals row i inside M = 2..40, wherever it sits,
  with and without bias, on one thread and two, on shapes small enough to stay on one thread and
  large enough to be split over two; the same bits whichever helper thread (cpu_work_pool.cpp)
  computes a column, helpers awake or asleep, and with two callers at once;
- the portable path (CPUs without AVX-512) gives the AVX-512 path's bits.

An unbuilt checkout compiles csrc/ on first use (SPECDEC_JIT_BUILD, as tests/test_suffix_tree.py).
"""
from __future__ import annotations

import os
import random

import pytest
import torch

os.environ.setdefault("SPECDEC_JIT_BUILD", "1")

from specdec_plugin.ops.contract import ContractError  # noqa: E402
from specdec_plugin.ops.linear import cpp, widened_reference  # noqa: E402

SEED = random.SystemRandom().randrange(2**31)
PACK_DTYPES = [torch.bfloat16, torch.float32]
# (N, K): SmolLM2's qkv, odd ones (N = 49: two partial zmm halves; N = 33: one column into a
# second panel; N = 7 < 16; K = 17, 1), and one big enough (M x N x K >= 6M) to use two threads.
SHAPES = [(960, 576), (49, 17), (33, 577), (7, 1), (200, 88), (3072, 576)]


def _gen(salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(SEED + salt)


def _case(m, n, k, salt, with_bias=True):
    g = _gen(salt)
    # Trained-layer scale, then rounded to bfloat16 and held as float32: what vLLM loads from a
    # bfloat16 checkpoint at dtype float32. randn is never all zeros; the check below makes sure.
    w = (torch.randn(n, k, generator=g) * k ** -0.5).bfloat16().float()
    # Activations at least 0.25 in magnitude, random sign: with K = 1 and no bias an output row is
    # N products x*w, and a plain randn x under ~0.008 (0.6% of draws) made the non-vacuity check
    # in test_matches_widened_reference fail on a correct kernel.
    x = torch.randn(m, k, generator=g)
    x = x + torch.where(x < 0, -0.25, 0.25)
    b = torch.randn(n, generator=g) if with_bias else None
    assert w.abs().sum() > 0 and (m == 0 or bool((x.abs() >= 0.25).all()))
    return x, w, b


def _ext():
    from specdec_plugin.spec_decode._native import load_extension

    return load_extension()


@pytest.mark.parametrize("pack_dtype", PACK_DTYPES)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [0, 1, 4, 13, 37])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_widened_reference(pack_dtype, n, k, m, with_bias):
    x, w, b = _case(m, n, k, salt=m * 7 + n + k, with_bias=with_bias)
    got = cpp.linear(x, cpp.pack_linear_weight(w, pack_dtype), b)
    want = widened_reference.linear(x, widened_reference.pack_linear_weight(w, pack_dtype), b)
    assert got.shape == (m, n) and got.dtype == torch.float32
    # Only the summation order differs (torch's GEMM picks its own): float32 rounding.
    torch.testing.assert_close(got, want, rtol=1e-5, atol=5e-5, msg=lambda s: f"seed {SEED}: {s}")
    if m:  # non-vacuous: products of randn values are not all (near) zero
        assert got.abs().max() > 1e-2, f"seed {SEED}: output (near) zero"


def test_bf16_weights_are_the_fp32_product():
    """On bfloat16-exact weights bf16 packing computes what fp32 packing computes, bit for bit
    (the same chains on the same values): the losslessness the device layer relies on."""
    x, w, b = _case(9, 200, 88, salt=1)
    y16 = cpp.linear(x, cpp.pack_linear_weight(w, torch.bfloat16), b)
    y32 = cpp.linear(x, cpp.pack_linear_weight(w, torch.float32), b)
    assert torch.equal(y16, y32), f"seed {SEED}"


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("pack_dtype", PACK_DTYPES)
@pytest.mark.parametrize("n,k", [(49, 17), (33, 577), (576, 1536), (3072, 576)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_rows_are_invariant_to_the_batch(threads, pack_dtype, n, k, with_bias):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rows, w, b = _case(40, n, k, salt=n + k + threads, with_bias=with_bias)
        packed = cpp.pack_linear_weight(w, pack_dtype)
        alone = torch.cat([cpp.linear(rows[i:i + 1], packed, b) for i in range(40)])
        order = torch.randperm(40, generator=_gen(3))
        for m in range(2, 41):
            # Rows in a different order per M, so each sits at many positions and tile slots.
            pick = torch.roll(order, m)[:m]
            got = cpp.linear(rows[pick], packed, b)
            if not torch.equal(got, alone[pick]):
                bad = (got != alone[pick]).any(dim=1).nonzero().flatten().tolist()
                pytest.fail(f"seed {SEED}: M={m}: rows at positions {bad} differ from M=1")
    finally:
        torch.set_num_threads(before)


def test_one_and_two_threads_agree():
    x, w, b = _case(24, 3072, 576, salt=5)
    packed = cpp.pack_linear_weight(w, torch.bfloat16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpp.linear(x, packed, b)
        torch.set_num_threads(2)
        two = cpp.linear(x, packed, b)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two), f"seed {SEED}"


@pytest.mark.parametrize("spin_us", [0, 100])
def test_helper_threads_give_the_same_bits(spin_us):
    """The linear layers share their panels out to helper threads (csrc/cpu_work_pool.cpp),
    claimed one pair at a time: whichever thread computes a column, its bits are the same. With
    spin_us 0 every call finds the helpers asleep and must wake them (or do the work alone)."""
    ext = _ext()
    before, spin_before = torch.get_num_threads(), ext.cpu_pool_spin_us()
    cases = [_case(m, n, k, salt=100 + m + n, with_bias=bool(m % 2))
             for m, n, k in [(1, 960, 576), (1, 3072, 576), (4, 576, 1536), (13, 49152 // 8, 576)]]
    packed = [cpp.pack_linear_weight(w, torch.bfloat16) for _, w, _ in cases]
    try:
        torch.set_num_threads(1)
        one = [cpp.linear(x, p, b) for (x, _, b), p in zip(cases, packed)]
        for threads in (2, 3):
            torch.set_num_threads(threads)
            ext.cpu_pool_configure(threads, spin_us)
            for _ in range(3):  # helpers asleep (spin 0) or spinning from the previous call
                for (x, _, b), p, want in zip(cases, packed, one):
                    assert torch.equal(cpp.linear(x, p, b), want), f"seed {SEED}: {threads} threads"
    finally:
        torch.set_num_threads(before)
        ext.cpu_pool_configure(before, spin_before)


def test_concurrent_callers_each_get_their_own_result():
    """Two Python threads calling at once (the kernel releases the GIL): one runs on the pool,
    the other on its own thread; neither sees the other's chunks."""
    import threading

    x1, w1, b1 = _case(3, 3072, 576, salt=11)
    x2, w2, b2 = _case(5, 576, 1536, salt=12)
    p1, p2 = cpp.pack_linear_weight(w1, torch.bfloat16), cpp.pack_linear_weight(w2, torch.bfloat16)
    want1, want2 = cpp.linear(x1, p1, b1), cpp.linear(x2, p2, b2)
    failures = []

    def call(x, p, b, want, tag):
        for _ in range(200):
            if not torch.equal(cpp.linear(x, p, b), want):
                failures.append(tag)
                return

    threads = [threading.Thread(target=call, args=(x1, p1, b1, want1, "first")),
               threading.Thread(target=call, args=(x2, p2, b2, want2, "second"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, f"seed {SEED}: wrong results in the {failures} caller"


@pytest.mark.parametrize("pack_dtype", PACK_DTYPES)
@pytest.mark.parametrize("n,k", [(49, 17), (200, 88), (33, 577)])
@pytest.mark.parametrize("m", [1, 2, 4, 13])
def test_portable_path_gives_the_same_bits(pack_dtype, n, k, m):
    """The vectorized path this CPU runs (AVX-512, else AVX2) against the element-at-a-time
    one: the same chains, so the same bits, at row counts that fill 1-3 row AVX2 tiles."""
    ext = _ext()
    if not ext.cpu_linear_packed_vectorized():
        pytest.skip("this CPU has neither AVX-512 nor AVX2: the portable path is the only one")
    x, w, b = _case(m, n, k, salt=11)
    packed = cpp.pack_linear_weight(w, pack_dtype)
    fast = ext.cpu_linear_packed(x, packed.weight, n, b, False)
    portable = ext.cpu_linear_packed(x, packed.weight, n, b, True)
    assert torch.equal(fast, portable), f"seed {SEED}"


def test_bf16_activations_come_back_bf16():
    """A bfloat16 model: x is widened (exact), the float32 result rounded once at the end."""
    x, w, b = _case(6, 64, 48, salt=13)
    xb = x.bfloat16().reshape(2, 3, 48)
    packed = cpp.pack_linear_weight(w, torch.bfloat16)
    got = cpp.linear(xb, packed, b.bfloat16())
    assert got.shape == (2, 3, 64) and got.dtype == torch.bfloat16
    want = cpp.linear(xb.reshape(6, 48).float(), packed, b.bfloat16().float()).bfloat16()
    assert torch.equal(got.reshape(6, 64), want), f"seed {SEED}"


def test_kernel_refuses_a_packing_that_does_not_fit():
    x, w, _ = _case(2, 64, 48, salt=17)
    packed = cpp.pack_linear_weight(w, torch.bfloat16)
    with pytest.raises(RuntimeError, match="does not fit"):
        _ext().cpu_linear_packed(x, packed.weight, 96, None, False)  # 3 panels' worth of N
    with pytest.raises(ContractError):
        cpp.linear(x[:, :47], packed)
