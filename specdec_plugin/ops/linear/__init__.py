"""Linear layers and the LM head: ``y = x @ weight.T + bias``, with the weight packed once.

Two ops, always taken from the same provider: ``pack_linear_weight(weight, dtype)`` turns a
layer's ``[out_features, in_features]`` weight into a :class:`PackedLinear` once, at load;
``linear(x, packed, bias)`` then runs every step. ``x`` is ``[..., in_features]`` in a float
dtype; the product is computed with ``x`` and the weight in ``packed.dtype`` (float32, or
bfloat16 where the device layer chooses it) and float32 accumulation, and returned in ``x``'s
dtype, shape ``[..., out_features]``. ``bias`` is ``[out_features]`` or None.

``PackedLinear.weight`` is the provider's own format (a plain tensor for the torch reference, an
opaque oneDNN tensor for ``onednn``, 32-column panels for ``cpp``), so a packed weight goes only
to the provider that made it (``provider`` names it).

The ``cpp`` provider and its reference ``torch_widened`` (``widened_reference.py``) keep a
stricter contract for bfloat16 packing: x is widened to float32, never rounded, and the result
is float32 (rounded only to x's dtype), and ``cpp`` reduces each output element in one fixed
order whatever the number of rows. On a bfloat16 checkpoint's weights that is the float32
model's product, row by row the same in a decode and a verification step.
``source`` is the tensor it was packed from: a caller that sees a layer's weight replaced after
packing (weight tying done late) packs again instead of using stale values.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedLinear:
    weight: object
    dtype: torch.dtype
    out_features: int
    in_features: int
    provider: str
    source: torch.Tensor
