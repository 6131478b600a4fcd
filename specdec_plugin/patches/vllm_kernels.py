"""P2: vLLM's Triton kernels on the V1 path, replaced by adapters to our kernels (see catalog).

The adapters come from the kernel packages (``specdec_plugin.ops.*.vllm_shims``): each one is
indexed with vLLM's launch grid and called with vLLM's exact arguments, like a Triton kernel,
and runs our kernel for the device's providers (our Triton on GPUs, torch on CPU).
"""
from __future__ import annotations

import importlib

# Kernel packages whose vLLM adapters are installed.
SHIM_MODULES = (
    "specdec_plugin.ops.spec_prep.vllm_shims",  # block-table slot mapping, EAGLE/MTP input prep
)


def table(providers: tuple[str, ...]) -> dict:
    """``{(vllm module, symbol): shim}`` running the first of ``providers`` (the device layer's,
    passed down by the worker) that has each kernel."""
    providers = tuple(providers)
    merged: dict = {}
    for name in SHIM_MODULES:
        merged.update(importlib.import_module(name).shim_table(providers))
    return merged


def apply(providers: tuple[str, ...]) -> None:
    for (module, attr), shim in table(providers).items():
        setattr(importlib.import_module(module), attr, shim)
