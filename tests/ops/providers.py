"""Registry-driven parameters for the kernel tests: every provider of every op that
``specdec_plugin/ops/registry.py`` lists under one ``ops/<folder>/``, each on the device it runs
on. Triton providers are marked ``gpu`` (their compiled kernels need one; the modules' small
interpreter tests cover them on CPU); the C++ providers run on the CPU.
"""
from __future__ import annotations

import pytest
import torch

from specdec_plugin.ops.registry import KERNELS, get_kernel, op_folder

REFERENCE = "torch"
_MARKS = {"triton": (pytest.mark.gpu,)}
_DEVICE = {"triton": "cuda"}


def ops_in(folder: str) -> list[str]:
    return sorted(op for op in KERNELS if op_folder(op) == folder)


def _params(folder: str, with_reference: bool) -> list:
    return [
        pytest.param(op, provider, marks=_MARKS.get(provider, ()), id=f"{op}-{provider}")
        for op in ops_in(folder) for provider in KERNELS[op]
        if with_reference or provider != REFERENCE
    ]


def providers_to_compare(folder: str) -> list:
    """``(op, provider)`` for every non-reference provider of the folder's ops."""
    return _params(folder, with_reference=False)


def every_provider(folder: str) -> list:
    """``(op, provider)`` for every provider, the reference included (contract checks)."""
    return _params(folder, with_reference=True)


def kernel(op: str, provider: str):
    return get_kernel(op, (provider,))


def device_for(provider: str) -> str:
    return _DEVICE.get(provider, "cpu")


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def host_providers(folder: str) -> list:
    """``(op, provider)`` for the providers whose inputs live in host memory: the ones whose
    validator also checks index values (an accelerator's would need a device sync)."""
    return [p for p in every_provider(folder) if device_for(p.values[1]) == "cpu"]


def small_shape_device() -> str:
    """Where the tiny-shape Triton tests run: the interpreter on CPU (tests/conftest.py switches
    it on when there is no GPU), else the GPU. Skips if Triton was imported compiled with no GPU."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(tl.sum, InterpretedFunction):
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    pytest.skip("no GPU and Triton is not in interpreter mode (set TRITON_INTERPRET=1 before "
                "anything imports triton)")
