"""worker/sync_debug.py: SPECDEC_SYNC_DEBUG sets the device's sync-debug mode once the engine
has started; a device without one says so; a bad value fails when the engine config is built."""
from __future__ import annotations

import random

import pytest

from specdec_plugin.worker import sync_debug


class _Layer:
    name = "fake"

    def __init__(self, has_mode: bool):
        self.has_mode = has_mode
        self.modes: list[str] = []

    def set_sync_debug_mode(self, mode: str) -> bool:
        self.modes.append(mode)
        return self.has_mode


@pytest.mark.parametrize("unset", [None, "", "0", "off"])
def test_off_unless_asked(monkeypatch, unset):
    if unset is None:
        monkeypatch.delenv("SPECDEC_SYNC_DEBUG", raising=False)
    else:
        monkeypatch.setenv("SPECDEC_SYNC_DEBUG", unset)
    layer = _Layer(has_mode=True)
    assert sync_debug.enable_after_startup(layer) is None
    assert layer.modes == []


def test_the_mode_reaches_the_device(monkeypatch):
    mode = random.choice(["warn", "error", "WARN "])
    monkeypatch.setenv("SPECDEC_SYNC_DEBUG", mode)
    layer = _Layer(has_mode=True)
    assert sync_debug.enable_after_startup(layer) == mode.strip().lower()
    assert layer.modes == [mode.strip().lower()]


def test_a_device_without_the_mode_reports_none(monkeypatch):
    from specdec_plugin.device.cpu import CpuDevice

    monkeypatch.setenv("SPECDEC_SYNC_DEBUG", "warn")
    assert CpuDevice().set_sync_debug_mode("warn") is False
    assert sync_debug.enable_after_startup(CpuDevice()) is None


def test_cuda_sets_torchs_mode(monkeypatch):
    import torch

    from specdec_plugin.device.cuda import CudaDevice

    seen = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", seen.append)
    mode = random.choice(["warn", "error"])
    assert CudaDevice().set_sync_debug_mode(mode) is True
    assert seen == [mode]


def test_a_bad_value_names_the_variable_before_any_model_loads(monkeypatch, smollm2_path):
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("SPECDEC_SYNC_DEBUG", "loud")
    with pytest.raises(ValueError, match=r"SPECDEC_SYNC_DEBUG='loud': expected one of warn, error"):
        EngineArgs(model=smollm2_path, dtype="float32").create_engine_config()
