"""What every op's validator (``ops/<op>/validate.py``) shares.

A validator checks what is cheap to check on the host: shapes, dtypes, devices and the integer
arguments that bound the buffers. Providers run inside CUDA graphs, where reading a device value
on the host is a sync (and during capture an error), so tensor *values* (index ranges) are
checked only where they already live in host memory: the CPU providers' inputs. There the check
is a small reduction, and it is what stands between a bad index and the C++ kernels' raw
pointer arithmetic.
"""
from __future__ import annotations

import torch


class ContractError(ValueError):
    """Inputs that break an op's contract (see the op package's docstring)."""


def fail(op: str, message: str) -> None:
    raise ContractError(f"{op}: {message}")


def values_on_host(t: torch.Tensor) -> bool:
    """Whether ``t`` lives in host memory, so its values can be read without a device sync
    (True for the CPU providers, False on an accelerator)."""
    return t.is_cpu


def same_device(op: str, anchor: torch.Tensor, **tensors: torch.Tensor | None) -> None:
    # get_device() is an int (-1 on the CPU): cheaper than building torch.device objects, and
    # this runs for every kernel call.
    device = anchor.get_device()
    for name, t in tensors.items():
        if t is not None and t.get_device() != device:
            fail(op, f"{name} is on {t.device}, the other inputs on {anchor.device}")


INDEX_DTYPES = (torch.int32, torch.int64)


class CheckedValues:
    """The inputs whose values one validator read last, so that it reads them once per step
    rather than once per layer: every layer of a step passes the same index tensors (the same
    objects). A tensor written in place since then (its ``_version`` moved) or any other
    argument makes it read them again. Inference tensors keep no version counter, so they
    are read every time. Only ever skips a repeat of a check that passed, so results never
    depend on what ran before."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._tensors: tuple = ()  # held, so that no other tensor can take their ids

    def seen(self, tensors: tuple[torch.Tensor, ...], *sizes: int) -> bool:
        """True if ``tensors`` (the same objects, unchanged) and ``sizes`` passed last time."""
        key = _key(tensors, sizes)
        return key is not None and key == self._key

    def passed(self, tensors: tuple[torch.Tensor, ...], *sizes: int) -> None:
        self._key, self._tensors = _key(tensors, sizes), tensors


def _key(tensors: tuple, sizes: tuple) -> tuple | None:
    # Integers only, so the comparison never calls a tensor's __eq__ (a loop: this runs for
    # every kernel call, and generator expressions cost more). None: not comparable.
    key = list(sizes)
    for t in tensors:
        if t.is_inference():  # no version counter: an in-place write would go unseen
            return None
        key.append(id(t))
        key.append(t._version)
    return tuple(key)
