"""Rejection sampling (``ops/rejection``): every registered provider against the torch
reference, the reference and our Triton kernels against vLLM 0.26's own Triton kernels (their
source, compiled by real Triton; on CPU under TRITON_INTERPRET=1), on seeded random batches,
plus a slow per-request loop written from the algorithm.

Outputs start filled with a sentinel that no kernel writes, so comparing whole tensors (exact,
element by element) also checks that every provider writes exactly the same elements.

Registry-driven: ``test_provider_matches_reference`` runs every provider the registry lists for
the folder's four ops (Triton's on a GPU: ``gpu``). Contract: every provider rejects an output
too narrow for ``max_spec_len`` and per-request tensors of the wrong length; providers on host
memory also reject a request with more drafts than ``max_spec_len``; empty batches write nothing.
"""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything compiles a Triton kernel

triton = pytest.importorskip("triton")

from specdec_plugin.ops.contract import ContractError  # noqa: E402
from specdec_plugin.ops.rejection import reference as ref  # noqa: E402
from specdec_plugin.ops.rejection import triton as tri  # noqa: E402
from tests.ops.providers import (  # noqa: E402
    device_for,
    every_provider,
    host_providers,
    kernel,
    providers_to_compare,
)
from tests.vllm_kernels import load_vllm_kernels  # noqa: E402

FOLDER = "rejection"

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SENTINEL = -7
VOCAB = 37


@pytest.fixture(scope="module")
def vllm_k():
    return load_vllm_kernels(
        "v1/sample/rejection_sampler.py",
        ["rejection_greedy_sample_kernel", "rejection_random_sample_kernel", "expand_kernel",
         "sample_recovered_tokens_kernel"],
    )


def make_batch(seed: int, batch: int = 12, max_spec_len: int = 5, greedy_mix: bool = True,
               device: str = DEVICE):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, max_spec_len + 1, (batch,), generator=g)
    counts[torch.randint(0, batch, (1,), generator=g)] = max_spec_len
    cu = counts.cumsum(0).to(torch.int32)
    n = int(cu[-1])
    logits = torch.randn(n, VOCAB, generator=g) * 3
    target_probs = logits.softmax(-1)
    target_argmax = logits.argmax(-1)
    # Drafts agree with the target argmax often enough that long accepted runs occur.
    draft = torch.where(torch.rand(n, generator=g) < 0.7, target_argmax,
                        torch.randint(0, VOCAB, (n,), generator=g)).to(torch.int32)
    draft[torch.rand(n, generator=g) < 0.1] = -1  # padded drafts
    # A draft close to the target, so p(x)/q(x) lands near the uniforms and decisions are tight.
    draft_probs = (logits + torch.randn(n, VOCAB, generator=g)).softmax(-1)
    draft_probs[torch.rand(n, VOCAB, generator=g) < 0.05] = 0.0  # q(x) = 0 must reject
    # Half the uniforms biased low so random-path drafts also get accepted at later positions.
    uniform = torch.rand(n, generator=g, dtype=torch.float64)
    uniform = torch.where(torch.rand(n, generator=g) < 0.5, uniform**4, uniform)
    is_greedy = torch.rand(batch, generator=g) < 0.5 if greedy_mix else None
    t = lambda x: None if x is None else x.to(device)  # noqa: E731
    return dict(
        cu=t(cu), counts=counts.tolist(), max_spec_len=max_spec_len, draft=t(draft),
        target_probs=t(target_probs), target_argmax=t(target_argmax), draft_probs=t(draft_probs),
        bonus=t(torch.randint(0, VOCAB, (batch, 1), generator=g, dtype=torch.int32)),
        recovered=t(torch.randint(0, VOCAB, (n,), generator=g, dtype=torch.int32)),
        uniform=t(uniform), is_greedy=t(is_greedy),
        rates=t(torch.tensor([0.9, 0.7, 0.5, 0.6, 0.8][:max_spec_len], dtype=torch.float32)),
        inv_q=t(torch.empty(batch, VOCAB).exponential_(generator=g).reciprocal()),
    )


def poisoned(b, device=DEVICE):
    return torch.full((len(b["counts"]), b["max_spec_len"] + 1), SENTINEL, dtype=torch.int32,
                      device=device)


def slow_rejection(b, greedy_rows, draft_probs, synthetic):
    """Per request, per position, straight from Leviathan et al. (and vLLM's greedy rule)."""
    out = poisoned(b).cpu()
    start = 0
    for r, n in enumerate(b["counts"]):
        greedy = greedy_rows[r]
        if greedy is None:
            start += n
            continue
        all_ok = True
        for p in range(n):
            t = start + p
            x = int(b["draft"][t])
            u = float(b["uniform"][t])
            if synthetic:
                ok = x >= 0 and u < float(b["rates"][p])
                tok = x if ok else (int(b["target_argmax"][t]) if greedy else int(b["recovered"][t]))
            elif greedy:
                ok = x == int(b["target_argmax"][t])
                tok = int(b["target_argmax"][t])
            else:
                px = float(b["target_probs"][t, max(x, 0)])
                qx = 1.0 if draft_probs is None else float(draft_probs[t, max(x, 0)])
                ok = x >= 0 and qx > 0 and px / qx >= u
                tok = x if ok else int(b["recovered"][t])
            out[r, p] = tok
            if not ok:
                all_ok = False
                break
        if all_ok:
            out[r, n] = int(b["bonus"][r, 0])
        start += n
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mixed", [True, False])
@pytest.mark.parametrize("synthetic", [False, True])
def test_greedy_kernel(vllm_k, seed, mixed, synthetic):
    b = make_batch(seed, greedy_mix=mixed)
    rates = b["rates"] if synthetic else None
    outs = []
    for impl in (ref.rejection_greedy_sample, tri.rejection_greedy_sample):
        out = poisoned(b)
        impl(out, b["cu"], b["draft"], b["target_argmax"], b["bonus"], b["is_greedy"],
             b["max_spec_len"], b["uniform"], rates)
        outs.append(out.cpu())
    vout = poisoned(b)
    vllm_k.rejection_greedy_sample_kernel[(len(b["counts"]),)](
        vout, b["cu"], b["draft"], b["target_argmax"], b["bonus"], b["is_greedy"],
        b["max_spec_len"], b["uniform"], rates, SYNTHETIC_MODE=synthetic,
    )
    if b["is_greedy"] is None:
        rows = [True] * len(b["counts"])
    else:
        rows = [True if bool(g) else None for g in b["is_greedy"]]
    slow = slow_rejection(b, rows, None, synthetic)
    assert (outs[0] != SENTINEL).any()
    torch.testing.assert_close(outs[0], vout.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(outs[1], vout.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(outs[0], slow, rtol=0, atol=0)


@pytest.mark.parametrize("seed", [3, 4, 5])
@pytest.mark.parametrize("with_draft_probs", [True, False])
@pytest.mark.parametrize("synthetic", [False, True])
def test_random_kernel(vllm_k, seed, with_draft_probs, synthetic):
    b = make_batch(seed)
    dp = b["draft_probs"] if with_draft_probs else None
    rates = b["rates"] if synthetic else None
    outs = []
    for impl in (ref.rejection_random_sample, tri.rejection_random_sample):
        out = poisoned(b)
        impl(out, b["cu"], b["draft"], dp, b["target_probs"], b["bonus"], b["recovered"],
             b["uniform"], b["is_greedy"], b["max_spec_len"], rates)
        outs.append(out.cpu())
    vout = poisoned(b)
    vllm_k.rejection_random_sample_kernel[(len(b["counts"]),)](
        vout, b["cu"], b["draft"], dp, b["target_probs"], b["bonus"], b["recovered"],
        b["uniform"], b["is_greedy"], b["max_spec_len"], VOCAB, rates,
        NO_DRAFT_PROBS=dp is None, SYNTHETIC_MODE=synthetic,
    )
    rows = [None if bool(g) else False for g in b["is_greedy"]]
    slow = slow_rejection(b, rows, None if dp is None else dp.cpu(), synthetic)
    assert (outs[0] != SENTINEL).any()
    torch.testing.assert_close(outs[0], vout.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(outs[1], vout.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(outs[0], slow, rtol=0, atol=0)


@pytest.mark.parametrize("seed", [6, 7])
@pytest.mark.parametrize("with_draft_probs", [True, False])
@pytest.mark.parametrize("fp64", [False, True])
def test_recovered_kernel(vllm_k, seed, with_draft_probs, fp64):
    b = make_batch(seed)
    dp = b["draft_probs"] if with_draft_probs else None
    inv_q = b["inv_q"].double() if fp64 else b["inv_q"]
    n = b["draft"].shape[0]
    outs = []
    for impl in (ref.sample_recovered_tokens, tri.sample_recovered_tokens):
        out = torch.full((n,), SENTINEL, dtype=torch.int32, device=DEVICE)
        impl(out, b["cu"], b["draft"], dp, b["target_probs"], inv_q)
        outs.append(out.cpu())
    vout = torch.full((n,), SENTINEL, dtype=torch.int32, device=DEVICE)
    vllm_k.sample_recovered_tokens_kernel[(len(b["counts"]), b["max_spec_len"])](
        vout, b["cu"], b["draft"], dp, b["target_probs"], inv_q, VOCAB, 16,
        NO_DRAFT_PROBS=dp is None, USE_FP64_GUMBEL=fp64,
    )
    assert (outs[0] >= 0).all()
    torch.testing.assert_close(outs[0], vout.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(outs[1], vout.cpu(), rtol=0, atol=0)
    if dp is None:  # the drafted token itself is never recovered
        drafted = b["draft"].cpu().long()
        assert not (outs[0].long() == drafted).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_expand_kernel(vllm_k, dtype):
    counts = torch.tensor([3, 0, 2, 5, 1])
    cu = counts.cumsum(0).to(torch.int32).to(DEVICE)
    x = torch.tensor([0, 4, 0, 2, 7]).to(dtype).to(DEVICE)  # zeros get replaced
    n = int(counts.sum())
    outs = []
    for impl in (ref.expand_batch_to_tokens, tri.expand_batch_to_tokens):
        out = torch.full((n,), SENTINEL, dtype=dtype, device=DEVICE)
        impl(out, x, cu, 0, 1)
        outs.append(out.cpu())
    vout = torch.full((n,), SENTINEL, dtype=dtype, device=DEVICE)
    vllm_k.expand_kernel[(5,)](vout, x, cu, 0, 1, MAX_NUM_TOKENS=128)
    expected = torch.tensor([1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 7]).to(dtype)
    assert torch.equal(outs[0], expected) and torch.equal(outs[1], expected)
    assert torch.equal(vout.cpu(), expected)


# ---------------------------------------------------------------------------------------------
# Every registered provider against the reference (the registry decides which run).

def greedy_case(impl, device, seed):
    outs = []
    for mixed, synthetic in ((True, False), (False, False), (True, True)):
        b = make_batch(seed, greedy_mix=mixed, device=device)
        out = poisoned(b, device)
        impl(out, b["cu"], b["draft"], b["target_argmax"], b["bonus"], b["is_greedy"],
             b["max_spec_len"], b["uniform"], b["rates"] if synthetic else None)
        outs.append(out)
    return outs


def random_case(impl, device, seed):
    outs = []
    for with_draft_probs, synthetic in ((True, False), (False, False), (True, True)):
        b = make_batch(seed, device=device)
        out = poisoned(b, device)
        impl(out, b["cu"], b["draft"], b["draft_probs"] if with_draft_probs else None,
             b["target_probs"], b["bonus"], b["recovered"], b["uniform"], b["is_greedy"],
             b["max_spec_len"], b["rates"] if synthetic else None)
        outs.append(out)
    return outs


def recovered_case(impl, device, seed):
    outs = []
    for with_draft_probs, fp64 in ((True, False), (False, False), (True, True)):
        b = make_batch(seed, device=device)
        out = torch.full_like(b["draft"], SENTINEL)
        inv_q = b["inv_q"].double() if fp64 else b["inv_q"]
        impl(out, b["cu"], b["draft"], b["draft_probs"] if with_draft_probs else None,
             b["target_probs"], inv_q)
        outs.append(out)
    return outs


def expand_case(impl, device, seed):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 4, (9,), generator=g)
    cu = counts.cumsum(0).to(torch.int32).to(device)
    outs = []
    for x in (torch.randint(0, 3, (9,), generator=g).float(),
              torch.randint(0, 3, (9,), generator=g).int()):
        out = torch.full((int(counts.sum()) + 3,), SENTINEL, dtype=x.dtype, device=device)
        impl(out, x.to(device), cu, 0, 1)  # the 3 rows past cu[-1] are a guard
        outs.append(out)
    return outs


CASES = {"rejection_greedy_sample": greedy_case, "rejection_random_sample": random_case,
         "sample_recovered_tokens": recovered_case, "expand_batch_to_tokens": expand_case}


@pytest.mark.parametrize("op,provider", providers_to_compare(FOLDER))
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_provider_matches_reference(op, provider, seed):
    device = device_for(provider)
    got = CASES[op](kernel(op, provider), device, seed)
    want = CASES[op](kernel(op, "torch"), device, seed)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert any((w != SENTINEL).any() for w in want)  # something was written


# ---------------------------------------------------------------------------------------------
# The contract's edges, for every provider (the reference included).

def _rejects(impl, calls: dict) -> None:
    for what, args in calls.items():
        try:
            impl(*args)
        except ContractError:
            continue
        pytest.fail(f"accepted: {what}")


@pytest.mark.parametrize("op,provider", [p for p in every_provider(FOLDER)
                                         if p.values[0] == "rejection_greedy_sample"])
def test_greedy_contract_rejects_bad_shapes(op, provider):
    b = make_batch(21, device=device_for(provider))
    out = poisoned(b, device_for(provider))
    args = [out, b["cu"], b["draft"], b["target_argmax"], b["bonus"], b["is_greedy"],
            b["max_spec_len"], None, None]

    def with_(i, value):
        return args[:i] + [value] + args[i + 1:]

    _rejects(kernel(op, provider), {
        "output narrower than max_spec_len + 1": with_(0, out[:, :-1]),
        "cu_num_draft_tokens of another batch": with_(1, b["cu"][:-1]),
        "bonus tokens of another batch": with_(4, b["bonus"][:-1]),
        "target_argmax shorter than the drafts": with_(3, b["target_argmax"][:-1]),
        "synthetic rates without uniforms": args[:8] + [b["rates"]],
    })
    assert (out == SENTINEL).all()


@pytest.mark.parametrize("op,provider", [p for p in every_provider(FOLDER)
                                         if p.values[0] == "sample_recovered_tokens"])
def test_recovered_contract_rejects_bad_shapes(op, provider):
    b = make_batch(22, device=device_for(provider))
    out = torch.full_like(b["draft"], SENTINEL)
    _rejects(kernel(op, provider), {
        "inv_q of another vocabulary": (out, b["cu"], b["draft"], None, b["target_probs"],
                                        b["inv_q"][:, :-1]),
        "draft_probs of another shape": (out, b["cu"], b["draft"], b["draft_probs"][:-1],
                                         b["target_probs"], b["inv_q"]),
        "output shorter than the drafts": (out[:-1], b["cu"], b["draft"], None,
                                           b["target_probs"], b["inv_q"]),
    })
    assert (out == SENTINEL).all()


@pytest.mark.parametrize("op,provider", [p for p in host_providers(FOLDER)
                                         if p.values[0] in ("rejection_greedy_sample",
                                                            "rejection_random_sample")])
def test_contract_rejects_more_drafts_than_max_spec_len(op, provider):
    b = make_batch(23, max_spec_len=5)
    out = poisoned(b)
    args = {"rejection_greedy_sample": (out, b["cu"], b["draft"], b["target_argmax"], b["bonus"],
                                        b["is_greedy"], 4, None, None),
            "rejection_random_sample": (out, b["cu"], b["draft"], None, b["target_probs"],
                                        b["bonus"], b["recovered"], b["uniform"], b["is_greedy"],
                                        4, None)}[op]
    with pytest.raises(ContractError, match="max_spec_len"):
        kernel(op, provider)(*args)  # a request has 5 drafts
    assert (out == SENTINEL).all()


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_empty_batch_writes_nothing(op, provider):
    device = device_for(provider)
    impl = kernel(op, provider)
    none = torch.zeros(0, dtype=torch.int32, device=device)
    probs = torch.zeros(0, VOCAB, device=device)
    out = torch.full((0, 4), SENTINEL, dtype=torch.int32, device=device)
    tokens = torch.full((3,), SENTINEL, dtype=torch.int32, device=device)
    call = {
        "rejection_greedy_sample": lambda: impl(out, none, none, none, none, None, 3),
        "rejection_random_sample": lambda: impl(out, none, none, None, probs, none, none,
                                                none.double(), None, 3),
        "sample_recovered_tokens": lambda: impl(tokens, none, none, None, probs,
                                                torch.zeros(0, VOCAB, device=device)),
        "expand_batch_to_tokens": lambda: impl(tokens, none, none, 0, 1),
    }[op]
    call()
    assert (tokens == SENTINEL).all()
