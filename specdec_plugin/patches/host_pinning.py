"""P10: pinned host memory on a worker with no accelerator, for the device n-gram path forced
onto the CPU (see the catalog).

vLLM's runner allocates the ``ngram_gpu`` staging buffers with a literal ``pin_memory=True``
and pins each new request's history before copying it; a CUDA torch with no GPU raises on
both. In a process that computes on the CPU only, pinned and pageable memory are the same
thing, so the stand-ins simply leave memory unpinned.
"""
from __future__ import annotations

import functools

import torch

_applied = False


def _unpinned_factory(factory):
    @functools.wraps(factory)
    def unpinned(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return factory(*args, **kwargs)

    return unpinned


def apply() -> None:
    """Idempotent; does nothing where an accelerator exists (pinning is real there)."""
    global _applied
    if _applied or torch.accelerator.is_available():
        return
    torch.zeros = _unpinned_factory(torch.zeros)
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
    _applied = True
