"""The entry point: detection, opt-out, and vLLM picking our platform (or not)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import specdec_plugin


def test_register_picks_cpu_without_gpu(monkeypatch):
    monkeypatch.delenv("SPECDEC_DISABLE", raising=False)
    monkeypatch.delenv("SPECDEC_DEVICE", raising=False)
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert specdec_plugin.register() == "specdec_plugin.platform.CpuSpecDecPlatform"


@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_register_opt_out(monkeypatch, value):
    monkeypatch.setenv("SPECDEC_DISABLE", value)
    assert specdec_plugin.register() is None


def test_register_forced_device(monkeypatch):
    monkeypatch.setenv("SPECDEC_DEVICE", "cuda")
    assert specdec_plugin.register() == "specdec_plugin.platform.CudaSpecDecPlatform"


def test_register_unknown_forced_device(monkeypatch):
    monkeypatch.setenv("SPECDEC_DEVICE", "tpu")
    with pytest.raises(ValueError, match="SPECDEC_DEVICE='tpu'.*use one of npu, cuda, cpu"):
        specdec_plugin.register()


def test_platform_classes_resolve():
    from vllm.utils.import_utils import resolve_obj_by_qualname

    # compile backend: Inductor where vLLM's own CUDA platform uses it (the 7B EAGLE step was
    # 4x slower with "eager", BENCHMARKS.md); "eager" on CPU and the NPU until measured there.
    for name, device_type, dispatch, backend in [("Cpu", "cpu", "CPU", "eager"),
                                                 ("Cuda", "cuda", "CUDA", "inductor"),
                                                 ("Npu", "npu", "PrivateUse1", "eager")]:
        cls = resolve_obj_by_qualname(f"specdec_plugin.platform.{name}SpecDecPlatform")
        assert cls.device_type == cls.device_name == device_type
        assert cls.dispatch_key == dispatch
        assert cls.is_out_of_tree(cls)
        assert cls.simple_compile_backend == cls.get_compile_backend() == backend


def _current_platform(env_overrides: dict) -> str:
    env = {**os.environ, **env_overrides}
    code = "from vllm.platforms import current_platform as p; print(type(p).__name__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_vllm_detects_our_platform_through_entry_point():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert _current_platform({"SPECDEC_DISABLE": ""}) == "CpuSpecDecPlatform"


def test_empty_vllm_plugins_gives_vllms_own_platform():
    # VLLM_PLUGINS="" loads no plugin at all: vLLM's own choice (here: no device found).
    assert _current_platform({"VLLM_PLUGINS": ""}) != "CpuSpecDecPlatform"
