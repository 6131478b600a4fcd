"""P4, P5: host stand-ins for ``torch.accelerator`` and CUDA streams/events (see the catalog).

Installed by the CPU device layer in its worker process (``CpuDevice.prepare_worker_process``),
only when torch reports no accelerator: that process computes on the CPU only, so recording,
waiting and synchronising have nothing to order.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch


class EventStandIn:
    """Host code is already in order on CPU: recording and waiting are no-ops."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, *args, **kwargs) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, *args, **kwargs) -> None:
        pass

    def query(self) -> bool:
        return True


class StreamStandIn:
    def __init__(self, *args, **kwargs) -> None:
        self.device = torch.device("cpu")

    def wait_stream(self, *args, **kwargs) -> None:
        pass

    def wait_event(self, *args, **kwargs) -> None:
        pass

    def synchronize(self) -> None:
        pass


def _noop(*args, **kwargs) -> None:
    return None


# (object, attribute) -> stand-in; the targets the catalog lists for P4 and P5.
def table() -> dict[tuple[object, str], object]:
    return {
        (torch.accelerator, "synchronize"): _noop,  # P4
        (torch.accelerator, "empty_cache"): _noop,  # P4
        (torch, "Event"): EventStandIn,  # P5
        (torch.cuda, "Event"): EventStandIn,
        (torch.cuda, "Stream"): StreamStandIn,
        (torch.cuda, "current_stream"): lambda *args, **kwargs: StreamStandIn(),
        (torch.cuda, "stream"): lambda *args, **kwargs: nullcontext(),
    }


def apply() -> None:
    if torch.accelerator.is_available():
        return  # a real accelerator is present; leave torch alone
    for (owner, attr), stand_in in table().items():
        setattr(owner, attr, stand_in)
