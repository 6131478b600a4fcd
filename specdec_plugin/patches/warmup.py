"""P1: replace vLLM's kernel warm-up (see the catalog in specdec_plugin/patches/__init__.py)."""
from __future__ import annotations


def specdec_kernel_warmup(worker) -> None:
    from vllm.model_executor.warmup.v1_block_table_warmup import warm_v1_block_table_kernels

    runner = worker.model_runner
    if runner.is_pooling_model:
        return
    warm_v1_block_table_kernels(runner.device, worker.scheduler_config.max_num_batched_tokens)


def apply() -> None:
    import vllm.v1.worker.gpu_worker as gpu_worker

    gpu_worker.kernel_warmup = specdec_kernel_warmup
