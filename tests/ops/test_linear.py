"""Linear layers and the LM head (``ops/linear``): every registered provider against the torch
reference, on seeded random inputs (never zeros), at decode and prefill row counts.

- Registry-driven: each provider's ``pack_linear_weight`` + ``linear`` pair against the
  reference pair; float32 packing must agree to float32 rounding (the products differ only in
  summation order), bfloat16 packing to bfloat16 rounding.
- Contract: a weight packed by another provider, a wrong width, a wrong bias shape and a
  non-matrix weight are refused by every provider.
"""
from __future__ import annotations

import pytest
import torch

from specdec_plugin.ops.contract import ContractError
from specdec_plugin.ops.linear import onednn, reference
from tests.ops.providers import every_provider, generator, kernel, providers_to_compare

FOLDER = "linear"

# (rows M, out_features N, in_features K): decode (1, 1+K drafts, 8 requests) and a prefill,
# on SmolLM2's shapes and odd ones (K not a multiple of 16, N not of 4).
SHAPES = [(1, 960, 576), (1, 49, 17), (4, 576, 1536), (8, 3072, 576), (37, 200, 88),
          (3, 49, 17)]
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def make_case(m, n, k, x_dtype, with_bias, seed):
    g = generator(seed)
    # Scaled as a trained layer's, so outputs are O(1) and tolerances mean something.
    w = torch.randn(n, k, generator=g) * k ** -0.5
    x = torch.randn(m, k, generator=g).to(x_dtype)
    b = torch.randn(n, generator=g) if with_bias else None
    return x, w, b


def check(pack, run, m, n, k, pack_dtype, x_dtype=torch.float32, with_bias=True, seed=0):
    x, w, b = make_case(m, n, k, x_dtype, with_bias, seed)
    want = reference.linear(x, reference.pack_linear_weight(w, pack_dtype), b)
    packed = pack(w, pack_dtype)
    got = run(x, packed, b)
    assert got.shape == (m, n) and got.dtype == x_dtype
    torch.testing.assert_close(got.float(), want.float(), **TOL[pack_dtype])
    # Non-vacuous: the result is not (near) zero and depends on the weight.
    assert got.float().abs().mean() > 0.1


def _pair(op, provider):
    return kernel("pack_linear_weight", provider), kernel("linear", provider)


def skip_unsupported(provider, pack_dtype):
    if provider == "onednn" and not onednn.supports(pack_dtype):
        pytest.skip(f"oneDNN on this CPU cannot pack {pack_dtype} (no avx512bw/vl/dq or "
                    "avx_ne_convert); test_onednn_refuses_what_this_cpu_cannot_pack covers it")


def pack_case(op, provider, shape, pack_dtype, with_bias):
    skip_unsupported(provider, pack_dtype)
    pack, run = _pair(op, provider)
    check(pack, run, *shape, pack_dtype, with_bias=with_bias, seed=sum(shape))


CASES = {"pack_linear_weight": pack_case, "linear": pack_case}


@pytest.mark.parametrize("op,provider", providers_to_compare(FOLDER))
@pytest.mark.parametrize("pack_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_provider_matches_reference(op, provider, shape, pack_dtype, with_bias):
    CASES[op](op, provider, shape, pack_dtype, with_bias)


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_batched_input_and_bf16_activations(op, provider):
    """[batch, seq, K] inputs keep their leading shape; bfloat16 activations come back bf16."""
    skip_unsupported(provider, torch.bfloat16)
    pack, run = _pair(op, provider)
    x, w, b = make_case(6, 64, 48, torch.bfloat16, True, seed=7)
    packed = pack(w, torch.bfloat16)
    got = run(x.reshape(2, 3, 48), packed, b)
    assert got.shape == (2, 3, 64) and got.dtype == torch.bfloat16
    want = reference.linear(x, reference.pack_linear_weight(w, torch.bfloat16), b)
    torch.testing.assert_close(got.reshape(6, 64).float(), want.float(), **TOL[torch.bfloat16])
    assert run(x[:0], packed, b).shape == (0, 64)


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_contract_rejects_bad_inputs(op, provider):
    pack, run = _pair(op, provider)
    x, w, b = make_case(2, 32, 16, torch.float32, True, seed=8)
    packed = pack(w, torch.float32)
    foreign = reference.pack_linear_weight(w, torch.float32) if provider != "torch" else None
    bad = {
        "width": lambda: run(x[:, :8], packed, b),
        "bias shape": lambda: run(x, packed, b[:5]),
        "int activations": lambda: run(x.int(), packed, b),
        "unpacked weight": lambda: run(x, w, b),
        "1-D weight": lambda: pack(w[0], torch.float32),
        "fp16 packing": lambda: pack(w, torch.float16),
    }
    if foreign is not None:
        bad["another provider's packing"] = lambda: run(x, foreign, b)
    for what, call in bad.items():
        with pytest.raises(ContractError):
            call()
            pytest.fail(f"accepted: {what}")



def test_onednn_refuses_what_this_cpu_cannot_pack():
    """On a CPU whose oneDNN has no bfloat16 linear (an AVX2-only AMD EPYC), packing says so
    and what to do instead, rather than torch's error from inside oneDNN."""
    if not onednn.available():
        pytest.skip("this torch has no oneDNN linear")
    assert onednn.supports(torch.float32)
    if onednn.supports(torch.bfloat16):
        pytest.skip("oneDNN on this CPU packs bfloat16 (test_provider_matches_reference runs it)")
    _, w, _ = make_case(2, 32, 16, torch.float32, False, seed=9)
    with pytest.raises(RuntimeError, match="cpp provider"):
        onednn.pack_linear_weight(w, torch.bfloat16)
