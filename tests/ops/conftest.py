"""Fixtures the kernel tests share."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture
def nan_empty(monkeypatch):
    """``torch.empty`` that returns NaN-filled floating tensors while the test runs, so an
    element a kernel fails to write shows."""
    real_empty = torch.empty

    def poisoned(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)


@pytest.fixture(scope="module")
def vllm_config():
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        yield
