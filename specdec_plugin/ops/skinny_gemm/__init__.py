"""Skinny GEMM: ``y = x @ weight.T + bias`` where ``x`` has at most ``MAX_ROWS`` (64) rows.

The product of a decode or verification step at small batch (issue 12): 1 to 64 token rows
against a whole weight matrix, bound (or nearly) by reading the weight once. ``x`` is ``[..., K]``,
``weight`` ``[N, K]`` with unit stride along K, ``bias`` ``[N]`` or None, all of one float
dtype (bfloat16 or float16: float32 stays with the vendor library, whose IEEE products the
exact-equality tests rely on). The result is ``[..., N]`` in that dtype: the float32
accumulation of the products, plus the bias, rounded once.

Providers: ``reference.py`` (``F.linear`` in float32, rounded once) and ``triton.py``.
"""
