"""Stand-ins for vLLM's ``@triton.jit`` kernels, launched the Triton way: ``kernel[grid](...)``.

Where Triton has no driver, vLLM's ``triton.jit`` is a placeholder that returns the plain
function, so ``kernel[grid](...)`` raises ``TypeError``. A ``VllmKernelShim`` assigned to the same
module attribute takes the launch unchanged: ``__getitem__(grid)`` returns a callable that binds
vLLM's own positional/keyword arguments (constexprs and launch options such as ``num_warps``
included) and forwards them, with the grid, to an adapter that calls one of our kernels.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch


class VllmKernelShim:
    """``shim[grid](*vllm_args, **vllm_kwargs)`` -> ``adapter(grid, *vllm_args, **vllm_kwargs)``."""

    def __init__(self, adapter: Callable, name: str):
        self.adapter = adapter
        self.__name__ = name

    def __getitem__(self, grid) -> Callable:
        if callable(grid):  # Triton also accepts grid(meta); our adapters need no meta-params.
            grid = grid({})
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        return functools.partial(self.adapter, grid)

    def __repr__(self) -> str:
        return f"VllmKernelShim({self.__name__})"


def rows_with_stride(t: torch.Tensor, row_stride: int) -> torch.Tensor:
    """View ``t`` as 2-D rows ``row_stride`` elements apart, as a kernel given
    ``ptr + row * stride`` addresses it (vLLM passes the stride separately)."""
    if t.dim() == 2 and t.stride(0) == row_stride and t.stride(1) == 1:
        return t
    flat = t.reshape(-1) if t.is_contiguous() else t.contiguous().reshape(-1)
    rows = flat.numel() // row_stride
    return flat[: rows * row_stride].view(rows, row_stride)
