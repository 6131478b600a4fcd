"""Bad input fails fast, before any model is loaded, with an error naming the problem and the fix."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _engine_config(**kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(**kwargs).create_engine_config()


def test_unsupported_dtype(smollm2_path):
    # vLLM wraps the platform's error in its config validation error; the message survives.
    with pytest.raises(Exception, match=r"dtype=float16 .* Fix: pass dtype= one of float32, bfloat16"):
        _engine_config(model=smollm2_path, dtype="float16")


def test_missing_model_path(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(ValueError, match=r"model='.*no-such-model': no such file or directory. Fix: pass"):
        _engine_config(model=missing)


def test_model_dir_without_config(tmp_path):
    with pytest.raises(ValueError, match=r"has no config.json.*Fix: point model at"):
        _engine_config(model=str(tmp_path))


def test_missing_draft_model_path(smollm2_path, tmp_path):
    spec = {"method": "draft_model", "model": str(tmp_path / "no-draft"), "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match=r"speculative_config.model='.*no-draft': no such file"):
        _engine_config(model=smollm2_path, dtype="float32", speculative_config=spec)


@pytest.fixture()
def moe_model_dir(tmp_path, smollm2_path):
    """A checkpoint directory whose config is a mixture-of-experts model (no weights needed:
    the check runs before anything is loaded)."""
    import shutil

    config = json.load(open(os.path.join(smollm2_path, "config.json")))
    config.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
                  num_local_experts=4, num_experts_per_tok=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(smollm2_path, name), tmp_path / name)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_unsupported_architecture(moe_model_dir):
    # vLLM wraps the platform's error in its config validation error; the message survives.
    with pytest.raises(Exception, match=r"MixtralForCausalLM.*mixture-of-experts.*Fix: serve a dense"):
        _engine_config(model=moe_model_dir, dtype="float32")


def test_forced_absent_device(smollm2_path):
    """SPECDEC_DEVICE=cuda on a machine without a GPU: clear error at engine configuration."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code = (
        "from vllm.engine.arg_utils import EngineArgs\n"
        f"EngineArgs(model={smollm2_path!r}, dtype='float32').create_engine_config()\n"
    )
    env = {**os.environ, "SPECDEC_DEVICE": "cuda"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "SPECDEC_DEVICE=cuda but no cuda device is visible" in out.stderr
    assert "Fix: unset SPECDEC_DEVICE" in out.stderr


def test_other_attention_backend_is_refused(smollm2_path):
    from vllm.config import set_current_vllm_config
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    with pytest.raises(ValueError, match="attention_backend=FLASH_ATTN .* Fix: drop --attention-backend"):
        current_platform.get_attn_backend_cls(AttentionBackendEnum.FLASH_ATTN, None)


def test_quantized_kv_cache_refused(smollm2_path):
    # vLLM wraps the platform's error in its config validation error; the message survives.
    with pytest.raises(Exception, match="kv_cache_dtype='fp8'.*Fix: leave kv_cache_dtype"):
        _engine_config(model=smollm2_path, dtype="float32", kv_cache_dtype="fp8")
