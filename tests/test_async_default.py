"""Async scheduling by default for the draft model (spec_decode/async_default.py, patch P6).

The decision is a pure function of the user's arguments and the device layer; the wiring is
checked by building a real engine config, where vLLM's explicit-async branch must accept it.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from specdec_plugin.device.cpu import CpuDevice
from specdec_plugin.device.cuda import CudaDevice
from specdec_plugin.spec_decode import async_default
from specdec_plugin.spec_decode.async_default import default_async_scheduling

DRAFT = {"method": "draft_model", "model": "/some/draft", "num_speculative_tokens": 4}


def _args(**kw):
    base = {"async_scheduling": None, "distributed_executor_backend": None,
            "data_parallel_backend": "mp"}
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("args, spec, layer, want", [
    (_args(), DRAFT, CudaDevice, True),                      # unset, measured device: on
    (_args(async_scheduling=False), DRAFT, CudaDevice, False),  # the user said no
    (_args(async_scheduling=True), DRAFT, CpuDevice, True),    # the user said yes: theirs
    (_args(), DRAFT, CpuDevice, None),                       # not measured there: vLLM decides
    (_args(), {**DRAFT, "method": "suffix"}, CudaDevice, None),  # other methods: vLLM decides
    (_args(), {**DRAFT, "disable_padded_drafter_batch": True}, CudaDevice, None),
    (_args(distributed_executor_backend="ray"), DRAFT, CudaDevice, None),
    (_args(distributed_executor_backend="mp"), DRAFT, CudaDevice, True),
    (_args(data_parallel_backend="ray"), DRAFT, CudaDevice, None),
])
def test_default_follows_user_method_device_and_executor(args, spec, layer, want):
    assert default_async_scheduling(args, spec, layer) is want


def test_vllm_accepts_the_default_for_the_draft_model(smollm2_path, monkeypatch):
    """With a device layer that asks for it, P6 passes async_scheduling=True and vLLM's
    explicit branch (which raises for methods it does not support) builds the config. The
    CPU platform then turns async scheduling off again (no device streams)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform.device), "async_draft_model", True)
    given = []

    def spy(args, spec, layer):
        given.append(default_async_scheduling(args, spec, layer))
        return given[-1]

    monkeypatch.setattr(async_default, "default_async_scheduling", spy)
    spec = {"method": "draft_model", "model": smollm2_path, "num_speculative_tokens": 3}
    config = EngineArgs(model=smollm2_path, speculative_config=spec, dtype="float32",
                        max_model_len=1024).create_engine_config()
    assert given == [True]
    assert config.speculative_config.method == "draft_model"
    assert config.scheduler_config.async_scheduling is False  # the CPU's own rule

    # Suffix is not on the list: vLLM's explicit branch would raise for it, so P6 leaves it.
    given.clear()
    config = EngineArgs(model=smollm2_path, dtype="float32", max_model_len=1024,
                        speculative_config={"method": "suffix", "num_speculative_tokens": 3}
                        ).create_engine_config()
    assert given == [None]
