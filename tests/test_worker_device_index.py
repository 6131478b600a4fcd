"""The worker's device selection (specdec_plugin/worker/device_index.py) is vLLM's: the data-parallel
offset of the local rank and the logical -> visible ordinal mapping, and vLLM's source of those
steps is still where the module says (it fails when vLLM changes them)."""
from __future__ import annotations

import importlib.util
import pathlib
from types import SimpleNamespace

import pytest
import vllm.platforms.interface as interface

from specdec_plugin.worker.device_index import dp_adjusted_local_rank, visible_device_index


def _parallel(backend="mp", dp_local=1, tp=2, pp=1, assigned=None, local_world_size=2):
    return SimpleNamespace(
        distributed_executor_backend=backend, data_parallel_backend="mp", nnodes_within_dp=1,
        data_parallel_rank_local=dp_local, data_parallel_index=dp_local,
        tensor_parallel_size=tp, pipeline_parallel_size=pp,
        assigned_physical_gpu_ids=assigned, local_world_size=local_world_size)


def _cuda_platform():
    from specdec_plugin.platform import _build

    return _build("cuda")  # our CUDA platform class (builds without a GPU)


def test_data_parallel_rank_offsets_the_local_rank():
    # DP rank 1 of TP=2: its TP rank 1 sits on the 4th local GPU, as in vLLM.
    assert dp_adjusted_local_rank(1, _parallel()) == 3
    assert dp_adjusted_local_rank(1, _parallel(dp_local=0)) == 1
    assert dp_adjusted_local_rank(1, _parallel(backend="ray")) == 1  # Ray places workers itself


def test_logical_rank_maps_to_the_visible_ordinal(monkeypatch):
    monkeypatch.setattr(interface, "_assigned_physical_gpu_ids", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    _Cuda = _cuda_platform()
    assert visible_device_index(3, _parallel(), _Cuda, device_count=4) == 3
    # An assigned mapping: logical 1 is physical 6, the third visible device.
    assert visible_device_index(1, _parallel(assigned=[4, 6]), _Cuda, device_count=4) == 2
    monkeypatch.setattr(interface, "_assigned_physical_gpu_ids", None)
    with pytest.raises(AssertionError, match="out of bounds"):
        visible_device_index(4, _parallel(), _Cuda, device_count=4)


def test_vllm_still_selects_the_device_this_way():
    vllm_dir = pathlib.Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
    text = (vllm_dir / "v1/worker/gpu_worker.py").read_text()
    for line in ("self.local_rank += dp_local_rank * tp_pp_world_size",
                 "set_assigned_physical_gpu_ids(assigned_physical_gpu_ids)",
                 "current_platform.logical_device_id_to_visible_device_id(self.local_rank)"):
        assert line in text, f"vLLM's Worker.init_device changed: {line!r} is gone"
