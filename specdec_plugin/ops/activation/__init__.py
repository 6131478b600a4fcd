"""SwiGLU gating (vLLM's ``SiluAndMul``): ``silu_and_mul(x) -> out``.

``x`` ``[..., 2 * d]`` (gate half first, then the up half); ``out`` ``[..., d]``, x's dtype, a
fresh tensor: ``out = silu(x[..., :d]) * x[..., d:]``.

Numerics follow vLLM's native op in eager PyTorch: silu is computed in fp32 and rounded to x's
dtype, then multiplied by the up half (in fp32) and rounded again.
"""
