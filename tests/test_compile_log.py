"""worker/compile_log.py: the opt-in hook logs each Triton compile with its whole description
and still calls the hook it found (vLLM's JIT monitor chains the same way)."""
from __future__ import annotations

import logging
import random

import pytest

triton = pytest.importorskip("triton")
from triton import knobs  # noqa: E402

from specdec_plugin.worker import compile_log  # noqa: E402


@pytest.fixture
def fresh_hook(monkeypatch):
    monkeypatch.setattr(compile_log, "_installed", False)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    yield
    compile_log._installed = False


def _compile_kwargs(pointer_class: str) -> dict:
    described = (f"_attention_tile_kernel[num_warps=8](q_ptr: ('*bf16', '{pointer_class}'), "
                 f"stride_qt: ('i32', 'D'))")
    return {"key": ("sig", [("*bf16", pointer_class)]), "repr": described, "fn": None,
            "compile": {"key": "k", "constants": {(20,): 128},
                        "configs": [{(0,): [["tt.divisibility", 16]]}]}}


def test_off_unless_asked(fresh_hook, monkeypatch):
    monkeypatch.delenv("SPECDEC_LOG_TRITON_COMPILES", raising=False)
    assert not compile_log.install()
    assert knobs.runtime.jit_post_compile_hook is None


def test_logs_the_whole_description_and_chains(fresh_hook, monkeypatch, caplog):
    monkeypatch.setenv("SPECDEC_LOG_TRITON_COMPILES", "1")
    seen = []
    knobs.runtime.jit_post_compile_hook = lambda **kwargs: seen.append(kwargs) or "earlier"
    assert compile_log.install()
    assert not compile_log.install()  # once per process
    pointer_class = random.choice(["D", ""])
    kwargs = _compile_kwargs(pointer_class)
    with caplog.at_level(logging.INFO):
        logger = logging.getLogger(compile_log.logger.name)
        logger.addHandler(caplog.handler)
        try:
            assert knobs.runtime.jit_post_compile_hook(**kwargs) == "earlier"
        finally:
            logger.removeHandler(caplog.handler)
    assert seen == [kwargs]
    line = next(r.getMessage() for r in caplog.records if "Triton compile" in r.getMessage())
    assert f"q_ptr: ('*bf16', '{pointer_class}')" in line
    assert "constants={(20,): 128}" in line
    assert "attrs={(0,): [['tt.divisibility', 16]]}" in line
