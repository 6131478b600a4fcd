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


def values_on_host(*tensors: torch.Tensor | None) -> bool:
    """Whether every given tensor lives in host memory, so its values can be read without a
    device sync (True for the CPU providers, False on an accelerator)."""
    return all(t is None or t.device.type == "cpu" for t in tensors)


def same_device(op: str, anchor: torch.Tensor, **tensors: torch.Tensor | None) -> None:
    device = anchor.device
    for name, t in tensors.items():
        if t is not None and t.device != device:
            fail(op, f"{name} is on {t.device}, the other inputs on {device}")


INDEX_DTYPES = (torch.int32, torch.int64)


class CheckedValues:
    """The inputs whose values one validator read last, so that it reads them once per step
    rather than once per layer: every layer of a step passes the same index tensors (the same
    objects). A tensor written in place since then (its ``_version`` moved) or any other
    argument makes it read them again. Only ever skips a repeat of a check that passed, so
    results never depend on what ran before."""

    def __init__(self) -> None:
        self._last: tuple = ()
        self._versions: tuple = ()

    def seen(self, *inputs) -> bool:
        """True if ``inputs`` (tensors and ints) passed the check last time, unchanged."""
        last = self._last
        return (len(last) == len(inputs)
                and all(a is b if isinstance(a, torch.Tensor) else a == b
                        for a, b in zip(last, inputs))
                and self._versions == _versions(inputs))

    def passed(self, *inputs) -> None:
        self._last, self._versions = inputs, _versions(inputs)


def _versions(inputs: tuple) -> tuple:
    return tuple(t._version for t in inputs if isinstance(t, torch.Tensor))
