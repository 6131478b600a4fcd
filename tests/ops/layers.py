"""What the model-layer kernel tests (rms_norm, rotary, activation, custom_ops) share."""
from __future__ import annotations

import torch


def randn(*shape, dtype, device="cpu", generator=None):
    return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)


def tol(dtype):
    # Half precision: two units in the last place (2^-9 for fp16, 2^-6 for bf16, relative), since
    # fp32 results that differ only in summation order or rsqrt rounding can round to outputs two
    # ulps apart (seen on the H100: fp16 rms_norm, 1 element of 2M, 0.0039 at 2.5).
    return {"float32": dict(rtol=1e-5, atol=1e-5), "float16": dict(rtol=2e-3, atol=1e-3),
            "bfloat16": dict(rtol=1.6e-2, atol=1e-2)}[str(dtype).split(".")[-1]]


def qkv_case(tokens, hq, hk, head_size, max_pos, rotary_dim, dtype, device="cpu",
             generator=None):
    """q/k as column views of one fused qkv buffer (as vLLM's attention layers pass them)."""
    qkv = randn(tokens, (hq + 2 * hk) * head_size, dtype=dtype, device=device,
                generator=generator)
    q, k = qkv[:, : hq * head_size], qkv[:, hq * head_size: (hq + hk) * head_size]
    cache = torch.randn(max_pos, rotary_dim, generator=generator).to(device)
    positions = torch.randint(0, max_pos, (tokens,), generator=generator).to(device)
    return qkv, q, k, cache, positions
