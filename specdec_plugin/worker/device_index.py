"""Which accelerator a worker uses: vLLM's selection from ``Worker.init_device``, for our devices.

vLLM 0.26 selects the device inline in ``Worker.init_device`` (v1/worker/gpu_worker.py:298-361,
reached only for ``device_type == "cuda"``), so a worker for another device type cannot call it.
This is the same selection, step for step, and the platform's own vLLM helpers do the mapping:
1. data parallelism on one node (not Ray, not external launchers): the local rank is offset by
   the local DP rank times TP x PP (vLLM: "DP_LOCAL_RANK * TP_PP_WORLD_SIZE + TP_LOCAL_RANK");
2. an assigned logical-to-physical mapping (``parallel_config.assigned_physical_gpu_ids``) is
   published with vLLM's ``set_assigned_physical_gpu_ids`` and bounds the rank;
3. ``Platform.logical_device_id_to_visible_device_id`` turns the logical rank into the ordinal
   visible to this process (``CUDA_VISIBLE_DEVICES`` or the device's control variable).
tests/test_worker_device_index.py pins vLLM's source of these steps.
"""
from __future__ import annotations


def dp_adjusted_local_rank(local_rank: int, parallel_config) -> int:
    """Step 1 (gpu_worker.py:302-319)."""
    if (
        parallel_config.distributed_executor_backend not in ("ray", "external_launcher")
        and parallel_config.data_parallel_backend != "ray"
        and parallel_config.nnodes_within_dp == 1
    ):
        dp_local_rank = parallel_config.data_parallel_rank_local
        if dp_local_rank is None:
            dp_local_rank = parallel_config.data_parallel_index
        tp_pp = parallel_config.pipeline_parallel_size * parallel_config.tensor_parallel_size
        local_rank += dp_local_rank * tp_pp
    return local_rank


def visible_device_index(local_rank: int, parallel_config, platform, device_count: int) -> int:
    """Steps 2 and 3 (gpu_worker.py:321-359) for an already DP-adjusted ``local_rank``."""
    assigned = parallel_config.assigned_physical_gpu_ids
    if assigned is not None:
        from vllm.platforms.interface import set_assigned_physical_gpu_ids

        set_assigned_physical_gpu_ids(assigned)
        assert local_rank < len(assigned), (
            f"local_rank {local_rank} is out of bounds for assigned_physical_gpu_ids {assigned}")
        if parallel_config.distributed_executor_backend not in ("ray", "external_launcher"):
            assert parallel_config.local_world_size <= len(assigned), (
                f"local_world_size ({parallel_config.local_world_size}) exceeds "
                f"assigned_physical_gpu_ids count ({len(assigned)})")
    else:
        assert local_rank < device_count, (
            f"DP adjusted local rank {local_rank} is out of bounds for {device_count} devices.")
    return platform.logical_device_id_to_visible_device_id(local_rank)
