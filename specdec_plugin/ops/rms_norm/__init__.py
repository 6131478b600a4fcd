"""RMS normalisation, optionally fused with the residual add (vLLM's ``RMSNorm``).

Contract shared by every provider, ``rms_norm(x, weight, eps, residual=None)``:
- ``x`` ``[..., hidden]``; ``weight`` ``[hidden]`` or None (a weightless norm);
- without ``residual``: returns ``out`` (x's shape and dtype);
- with ``residual`` (x's shape): returns ``(out, new_residual)`` where ``new_residual`` is
  ``x + residual`` rounded to x's dtype, and ``out`` normalises the *unrounded* fp32 sum.
Inputs are never written; outputs are fresh tensors.

Numerics follow vLLM's native op (``vllm.ir.ops.rms_norm`` / ``fused_add_rms_norm``): the sum and
the mean of squares are fp32, the normalised row is rounded to the weight's dtype before the
weight multiply (rounded again to that dtype), then cast to x's dtype. The variance always
covers the whole row (vLLM's ``var_hidden_size`` override is not part of this op).
"""
