"""Graph capture sizes with speculative decoding: n*(1+K), chosen or corrected with a warning.

The engine on CPU runs without graphs, so these tests drive ``apply_capture_sizes`` with vLLM's
own ``CompilationConfig`` inside a minimal config holder (the function reads three sub-configs).
On the GPU the same code runs inside a real engine (tests/gpu/).
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm.config.compilation import CompilationConfig, CUDAGraphMode  # noqa: E402

from specdec_plugin.capture_sizes import (  # noqa: E402
    apply_capture_sizes,
    recording_user_sizes,
    round_user_sizes,
    spec_decode_capture_sizes,
)


def _config(sizes, k, max_num_seqs=32, max_tokens=8192, mode=CUDAGraphMode.FULL_AND_PIECEWISE):
    compilation = CompilationConfig(cudagraph_mode=mode)
    compilation.cudagraph_capture_sizes = list(sizes)
    compilation.max_cudagraph_capture_size = max(sizes) if sizes else 0
    spec = SimpleNamespace(num_speculative_tokens=k) if k is not None else None
    scheduler = SimpleNamespace(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_tokens)
    return SimpleNamespace(compilation_config=compilation, speculative_config=spec,
                           scheduler_config=scheduler)


@pytest.mark.parametrize("k,max_num_seqs", [(1, 8), (4, 16), (4, 256), (3, 1000), (7, 3)])
def test_chosen_sizes_are_multiples_up_to_max_num_seqs(k, max_num_seqs):
    sizes = spec_decode_capture_sizes(1 + k, max_num_seqs, max_num_tokens=1 << 20)
    assert all(s % (1 + k) == 0 for s in sizes)
    assert sizes == sorted(set(sizes))
    assert sizes[0] == 1 + k
    assert sizes[-1] == max_num_seqs * (1 + k)


def test_chosen_sizes_respect_the_token_budget():
    sizes = spec_decode_capture_sizes(5, 256, max_num_tokens=512)
    assert sizes[-1] <= 512 and sizes[-1] == 510
    assert all(s % 5 == 0 for s in sizes)


def test_user_sizes_rounded_up():
    assert round_user_sizes([1, 2, 3, 8, 10, 33], 5, 8192) == [5, 10, 35]
    assert round_user_sizes([100], 5, 50) == [5]  # nothing fits: the smallest decode batch


def test_apply_chooses_sizes_when_the_user_gave_none():
    config = _config([1, 2, 4, 8, 16, 24, 32], k=4, max_num_seqs=16)
    with recording_user_sizes(None):
        apply_capture_sizes(config)
    sizes = config.compilation_config.cudagraph_capture_sizes
    assert sizes == [5, 10, 20, 40, 80]
    assert config.compilation_config.max_cudagraph_capture_size == 80


def test_apply_corrects_user_sizes_with_a_warning(caplog):
    config = _config([1, 2, 3, 8], k=2)
    with caplog.at_level(logging.WARNING), recording_user_sizes([8, 3, 2, 1]):
        apply_capture_sizes(config)
    assert config.compilation_config.cudagraph_capture_sizes == [3, 9]
    warning = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "[1, 2, 3, 8] changed to [3, 9]" in warning and "num_speculative_tokens=2" in warning


def test_apply_keeps_user_sizes_that_are_already_multiples(caplog):
    config = _config([3, 6, 12], k=2)
    with caplog.at_level(logging.WARNING), recording_user_sizes([3, 6, 12]):
        apply_capture_sizes(config)
    assert config.compilation_config.cudagraph_capture_sizes == [3, 6, 12]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_apply_in_a_worker_only_rounds():
    # No recording (a worker rebuilding the config): round what is there, choose nothing.
    config = _config([5, 10, 12], k=4)
    apply_capture_sizes(config)
    assert config.compilation_config.cudagraph_capture_sizes == [5, 10, 15]


@pytest.mark.parametrize("k,mode", [(None, CUDAGraphMode.FULL_AND_PIECEWISE), (4, CUDAGraphMode.NONE)])
def test_apply_leaves_configs_without_spec_or_graphs(k, mode):
    config = _config([1, 2, 4], k=k, mode=mode)
    with recording_user_sizes(None):
        apply_capture_sizes(config)
    assert config.compilation_config.cudagraph_capture_sizes == [1, 2, 4]


def test_engine_args_record_the_user_sizes():
    from vllm.engine.arg_utils import EngineArgs

    from specdec_plugin.patches.engine_args import _user_capture_sizes

    assert _user_capture_sizes(EngineArgs(model="x")) is None
    args = EngineArgs(model="x", compilation_config={"cudagraph_capture_sizes": [4, 2]})
    assert _user_capture_sizes(args) == [4, 2]
