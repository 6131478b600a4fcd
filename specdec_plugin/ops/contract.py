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


class PassedStructure:
    """The structural signature one validator's shape/dtype/stride/device checks last passed.

    A validator builds the signature from exactly the tensor properties its structural checks
    read (shapes, the strides it tests, dtypes, ``get_device()``), so those checks are a pure
    function of it: an equal signature would pass them again, and they are skipped. The checks
    cost ~25 Python-level tensor calls and comparisons per kernel call, while the layers of an
    eager step pass tensors of one structure (new objects each layer, so identity cannot tell).
    Only a signature that passed is kept, so a bad input fails exactly as before, on every
    call. Integer arguments are not part of it: their checks are cheap and always run.
    Properties only, never ids or data pointers: nothing here can go stale, inference tensors
    included (they keep no version counter)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: tuple | None = None


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
