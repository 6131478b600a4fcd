"""The linear contract (package docstring) as checks every provider runs first."""
from __future__ import annotations

import torch

from specdec_plugin.ops.contract import fail, same_device
from specdec_plugin.ops.linear import PackedLinear

_PACK, _OP = "pack_linear_weight", "linear"
PACK_DTYPES = (torch.float32, torch.bfloat16)
X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_pack(weight: torch.Tensor, dtype: torch.dtype) -> None:
    if weight.dim() != 2 or weight.numel() == 0:
        fail(_PACK, f"weight must be a non-empty [out_features, in_features]; got "
                    f"{tuple(weight.shape)}")
    if dtype not in PACK_DTYPES or weight.dtype not in X_DTYPES:
        fail(_PACK, f"packs {X_DTYPES} weights into {PACK_DTYPES}; got {weight.dtype} -> {dtype}")


def check_linear(x: torch.Tensor, packed: PackedLinear, bias: torch.Tensor | None,
                 provider: str) -> None:
    if not isinstance(packed, PackedLinear) or packed.provider != provider:
        fail(_OP, f"the weight must be packed by the {provider!r} provider's "
                  f"pack_linear_weight; got {type(packed).__name__} "
                  f"{getattr(packed, 'provider', '')!r}")
    if x.dim() < 1 or x.shape[-1] != packed.in_features:
        fail(_OP, f"x {tuple(x.shape)} must end in in_features {packed.in_features}")
    if x.dtype not in X_DTYPES:
        fail(_OP, f"x must be one of {X_DTYPES}; got {x.dtype}")
    if bias is not None and (bias.shape != (packed.out_features,)
                             or not bias.is_floating_point()):
        fail(_OP, f"bias must be a float [{packed.out_features}]; got {tuple(bias.shape)} "
                  f"{bias.dtype}")
    same_device(_OP, x, bias=bias, weight=packed.source)
