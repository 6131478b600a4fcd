"""Skinny GEMM (``ops/skinny_gemm``): every registered provider against the torch reference, the
row independence the kernel promises, and the contract's edges.

- Registry-driven: each provider runs on seeded random inputs (1, 3, 16, 17 and 64 rows: both
  row tiles and their edges; a 3-D input, a strided one, a bias, K and N that are not
  multiples of the blocks) and must match the
  reference within one rounding of the half-precision result; outputs start as NaN
  (``nan_empty``), so an unwritten element fails.
- Small shapes under Triton's interpreter on CPU in float16 only: the interpreter's bfloat16
  ``tl.dot`` returns garbage on this host (seen 2026-12-07), so bfloat16 is left to the GPU.
- A row's result does not depend on the other rows of its tile: alone (a plain decode step)
  and among 16 (a verification step) it is the same to the bit, and so among 17-64.
- Every input layout reaches the kernel as one layout (aligned, row stride K), so a layout
  first seen while serving compiles no new variant (gpu: Triton's kernel cache does not grow).
- Contract: more than 64 rows, float32, a K that does not match or a bias of the wrong shape
  fail with the op's name.
"""
from __future__ import annotations

import pytest
import torch

from specdec_plugin.ops.contract import ContractError
from specdec_plugin.ops.skinny_gemm import reference as gemm_ref
from tests.ops.layers import randn, tol
from tests.ops.providers import (device_for, every_provider, generator, kernel,
                                 providers_to_compare, small_shape_device)

FOLDER = "skinny_gemm"
DTYPES = [torch.bfloat16, torch.float16]


def skinny_gemm_case(gemm, device, dtype, seed, n=200, k=576):
    """k=576 (SmolLM2's hidden size) is not a multiple of the 256-wide K tile, n=200 not of
    any N tile: both edges are masked."""
    g = generator(seed)
    weight = (0.05 * randn(n, k, dtype=torch.float32, generator=g)).to(device, dtype)
    bias = randn(n, dtype=dtype, device=device, generator=g)
    x64 = randn(64, k, dtype=dtype, device=device, generator=g)
    wide = randn(3, k + 8, dtype=dtype, device=device, generator=g)
    return {"one_row": gemm(x64[:1], weight), "three_rows": gemm(x64[:3], weight, bias),
            "sixteen_rows": gemm(x64[:16], weight), "3d": gemm(x64[:6].reshape(2, 3, k), weight),
            "strided": gemm(wide[:, 4: 4 + k], weight, bias),
            "seventeen_rows": gemm(x64[:17], weight, bias),
            "sixty_four_rows": gemm(x64, weight)}


CASES = {"skinny_gemm": skinny_gemm_case}


def assert_case_matches_reference(gemm, device, dtype, seed, n=200, k=576,
                                  case=skinny_gemm_case):
    got = case(gemm, device, dtype, seed, n, k)
    want = case(gemm_ref.skinny_gemm, device, dtype, seed, n, k)
    for name in want:
        assert got[name].shape == want[name].shape, name
        torch.testing.assert_close(got[name], want[name], msg=name, **tol(dtype))


def assert_rows_do_not_depend_on_the_batch(gemm, x, weight, row_slices):
    """Each slice of rows multiplied alone equals the same rows of the whole product, to the
    bit."""
    together = gemm(x, weight)
    for rows in row_slices:
        assert torch.equal(gemm(x[rows], weight), together[rows]), rows


@pytest.mark.parametrize("op,provider", providers_to_compare(FOLDER))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_provider_matches_reference(nan_empty, op, provider, dtype, seed):
    assert_case_matches_reference(kernel(op, provider), device_for(provider), dtype, seed,
                                  case=CASES[op])


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 14336), (32000, 4096)])
def test_triton_model_shapes_on_gpu(n, k):
    """The 7B benchmark model's qkv, down and LM-head shapes, bfloat16, as the engine runs them
    (both row tiles)."""
    from specdec_plugin.ops.skinny_gemm import triton as gemm_triton

    g = generator(7)
    weight = (0.02 * randn(n, k, dtype=torch.float32, generator=g)).to("cuda", torch.bfloat16)
    for rows in (1, 3, 5, 16, 17, 48, 64):
        x = randn(rows, k, dtype=torch.bfloat16, device="cuda", generator=g)
        torch.testing.assert_close(gemm_triton.skinny_gemm(x, weight),
                                   gemm_ref.skinny_gemm(x, weight), **tol(torch.bfloat16))


@pytest.mark.parametrize("n,k", [(200, 576), (64, 256), (48, 100)])
def test_triton_small_shapes(nan_empty, n, k):
    from specdec_plugin.ops.skinny_gemm import triton as gemm_triton

    assert_case_matches_reference(gemm_triton.skinny_gemm, small_shape_device(), torch.float16,
                                  3, n, k)


@pytest.mark.parametrize("split_k,k", [(2, 320), (3, 300)])
def test_triton_split_k_matches_reference(nan_empty, split_k, k):
    """The benchmark's split-K configs (not the default): ragged last split, bias once."""
    from specdec_plugin.ops.skinny_gemm import triton as gemm_triton

    device = small_shape_device()
    dtype = torch.bfloat16 if device == "cuda" else torch.float16

    def split(x, weight, bias=None):
        block_m = gemm_triton.tile_rows(x.numel() // x.shape[-1])
        return gemm_triton.launch(x, weight, bias, (16, 64, 4, 2, split_k), block_m)

    assert_case_matches_reference(split, device, dtype, 5, 72, k)


def test_triton_wide_tile_matches_float32_product(nan_empty):
    """The benchmark's wide-tile probe (``launch(..., block_m=64)``, 40 rows, more than the op
    accepts) computes the same product: its timings are of a correct kernel."""
    from specdec_plugin.ops.skinny_gemm import triton as gemm_triton

    device = small_shape_device()
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    g = generator(7)
    weight = (0.05 * randn(72, 200, dtype=torch.float32, generator=g)).to(device, dtype)
    x = randn(40, 200, dtype=dtype, device=device, generator=g)
    got = gemm_triton.launch(x, weight, None, (32, 64, 4, 2, 1), block_m=64)
    want = torch.nn.functional.linear(x.float(), weight.float()).to(dtype)
    torch.testing.assert_close(got, want, **tol(dtype))
    with pytest.raises(AssertionError, match="block_m"):
        gemm_triton.launch(x, weight, None, (32, 64, 4, 2, 1), block_m=32)


@pytest.mark.parametrize("rows,slices", [
    (16, ((0, 1), (5, 6), (15, 16), (2, 5))),  # the 16-row tile: decode against verification
    (64, ((0, 17), (20, 48), (40, 64))),  # the 64-row tile: 17 to 64 rows (batch-16 steps)
])
def test_triton_rows_do_not_depend_on_the_batch(nan_empty, rows, slices):
    """Within a row tile, a row multiplied alone or among fewer rows equals the same row of
    the whole product, to the bit: a decode step and a verification step compute a token's
    projections identically."""
    from specdec_plugin.ops.skinny_gemm import triton as gemm_triton

    device = small_shape_device()
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    g = generator(11)
    weight = randn(96, 320, dtype=dtype, device=device, generator=g)
    x = randn(rows, 320, dtype=dtype, device=device, generator=g)
    assert_rows_do_not_depend_on_the_batch(gemm_triton.skinny_gemm, x, weight,
                                           [slice(*pair) for pair in slices])


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(6144, 4096), (28672, 4096)])
def test_rows_do_not_depend_on_the_batch_at_model_shapes(n, k):
    """The row independence above, on the GPU with the configs the 7B shapes get (a one-wave
    and a many-wave grid): 1, 3 and 5 rows (decode, the verifications of 2 and 4 drafts)
    equal the same rows among 16, to the bit."""
    from specdec_plugin.ops.skinny_gemm import triton as gemm_triton

    g = generator(19)
    weight = (0.02 * randn(n, k, dtype=torch.float32, generator=g)).to("cuda", torch.bfloat16)
    x = randn(16, k, dtype=torch.bfloat16, device="cuda", generator=g)
    assert_rows_do_not_depend_on_the_batch(
        gemm_triton.skinny_gemm, x, weight,
        (slice(0, 1), slice(7, 8), slice(0, 3), slice(11, 16)))
    # The wide tile: 48 and 17 rows (verifications of 2 drafts at batch 16, and the tile's
    # first row count) equal the same rows among 64.
    x64 = randn(64, k, dtype=torch.bfloat16, device="cuda", generator=g)
    assert_rows_do_not_depend_on_the_batch(gemm_triton.skinny_gemm, x64, weight,
                                           (slice(0, 48), slice(30, 47), slice(47, 64)))


def test_every_input_layout_reaches_the_kernel_in_one_layout():
    """``canonical_rows``: whatever the input's strides and offset, the kernel sees rows that
    are 16-byte aligned with unit stride along K and row stride K (a single row's stride is
    never read), the values unchanged; the usual layout is passed through without a copy.
    Triton compiles a variant per alignment and stride class, so this is what keeps a layout
    first seen while serving from compiling mid-request."""
    from specdec_plugin.ops.skinny_gemm.triton import canonical_rows

    k = 96
    g = generator(13)
    base = randn(8 * (k + 8) + 64, dtype=torch.bfloat16, generator=g)
    fresh = randn(3, k, dtype=torch.bfloat16, generator=g)
    layouts = {
        "fresh": fresh,
        "3-d": randn(2, 3, k, dtype=torch.bfloat16, generator=g),
        "column slice": base[: 3 * (k + 8)].view(3, k + 8)[:, 4: 4 + k],
        "transposed": randn(k, 3, dtype=torch.bfloat16, generator=g).t(),
        "odd offset": base[1: 1 + 2 * k].view(2, k),
        "one row, odd offset": base[3: 3 + k].view(1, k),
        "one row, odd stride": base.as_strided((1, k), (7, 1)),
    }
    for name, x in layouts.items():
        rows = canonical_rows(x, k)
        assert torch.equal(rows, x.reshape(-1, k)), name
        assert rows.stride(-1) == 1 and rows.data_ptr() % 16 == 0, name
        assert rows.shape[0] == 1 or rows.stride(0) == k, name
    assert canonical_rows(fresh, k).data_ptr() == fresh.data_ptr()  # no copy


@pytest.mark.gpu
def test_one_compiled_variant_serves_every_layout():
    """On the GPU: after the first product with a weight in a row tile, inputs of other
    layouts and row counts in that tile compile nothing more (Triton's per-device kernel
    cache does not grow)."""
    from specdec_plugin.ops.skinny_gemm import triton as gemm_triton

    g = generator(17)
    k = 576
    weight = (0.05 * randn(960, k, dtype=torch.float32, generator=g)).to("cuda", torch.bfloat16)
    base = randn(16 * (k + 8) + 64, dtype=torch.bfloat16, device="cuda", generator=g)
    gemm_triton.skinny_gemm(base[: 5 * k].view(5, k), weight)
    cache = gemm_triton._skinny_gemm_kernel.device_caches[torch.cuda.current_device()][0]
    compiled = len(cache)
    for x in (base[: k].view(1, k), base[3: 3 + k].view(1, k), base.as_strided((1, k), (1, 1)),
              base[: 16 * (k + 8)].view(16, k + 8)[:, 4: 4 + k], base[1: 1 + 2 * k].view(2, k)):
        torch.testing.assert_close(gemm_triton.skinny_gemm(x, weight),
                                   gemm_ref.skinny_gemm(x, weight), **tol(torch.bfloat16))
    assert len(cache) == compiled
    # The 64-row tile: one more variant at its first product, none for its other row counts.
    wide = randn(64 * (k + 8) + 64, dtype=torch.bfloat16, device="cuda", generator=g)
    gemm_triton.skinny_gemm(wide[: 17 * k].view(17, k), weight)
    assert len(cache) == compiled + 1
    for x in (wide[: 64 * k].view(64, k), wide[1: 1 + 40 * k].view(40, k),
              wide[: 48 * (k + 8)].view(48, k + 8)[:, 4: 4 + k]):
        torch.testing.assert_close(gemm_triton.skinny_gemm(x, weight),
                                   gemm_ref.skinny_gemm(x, weight), **tol(torch.bfloat16))
    assert len(cache) == compiled + 1


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_contract_rejects_bad_inputs(op, provider):
    gemm = kernel(op, provider)
    device = device_for(provider)
    weight = randn(32, 64, dtype=torch.float16, device=device)
    bad = {
        "more than 64": (randn(65, 64, dtype=torch.float16, device=device), weight, None),
        "must share one dtype": (randn(2, 64, dtype=torch.float32, device=device),
                                 weight.float(), None),
        "must end in K=64": (randn(2, 63, dtype=torch.float16, device=device), weight, None),
        "bias": (randn(2, 64, dtype=torch.float16, device=device), weight,
                 randn(31, dtype=torch.float16, device=device)),
        "unit stride": (randn(2, 32, dtype=torch.float16, device=device), weight.t(), None),
    }
    for words, args in bad.items():
        with pytest.raises(ContractError, match=f"skinny_gemm: .*{words}"):
            gemm(*args)


def test_block_configs_follow_the_h100_sweep():
    """``block_config`` and the wide tile's rule against the measurements they were drawn from
    (benchmarks/results/skinny_gemm_sweep_session65_h100.json, 132 multiprocessors): at 3 rows
    each shape's config is within 2.5% of the best swept one; at 40 rows the wide config is
    within 1% of the probe's best, and ``wide_tile_pays`` says yes exactly where that best beat
    cuBLAS."""
    import json
    from pathlib import Path

    from specdec_plugin.ops.skinny_gemm import triton as gemm_triton

    path = (Path(__file__).resolve().parents[2] / "benchmarks" / "results"
            / "skinny_gemm_sweep_session65_h100.json")
    shapes = json.loads(path.read_text())["shapes"]
    assert len(shapes) == 6
    for name, shape in shapes.items():
        n, k = shape["N"], shape["K"]
        swept = {tuple(c["config"]): c["us"] for c in shape["sweep_3_rows"]}
        narrow = gemm_triton.block_config(n, k, 132)
        assert swept[narrow] <= 1.025 * min(swept.values()), (name, narrow)
        probe = shape["wide"]["40"]
        best = {tuple(c["config"]): c["us"] for c in probe["best"]}
        wide = gemm_triton.block_config(n, k, 132, block_m=64)
        assert wide == gemm_triton.wide_block_config(n, k, 132)
        assert best.get(wide, float("inf")) <= 1.01 * min(best.values()), (name, wide)
        pays = min(best.values()) < probe["cublas_us"]
        assert gemm_triton.wide_tile_pays(n, 132) == pays, name
