"""P9: bind KV caches when two attention layers share a layer index (see the catalog).

A draft model of the target's own architecture has layers numbered like the target's, so two
attention layers share each index. vLLM's ``bind_kv_cache`` accepts that only on CUDA, XPU and
its own CPU platform ("the runner is not impacted") and raises NotImplementedError for any
other platform. Ours is the same V1 runner, so it binds them the same way.
"""
from __future__ import annotations

from collections import defaultdict

import torch


def bind_kv_cache(kv_caches: dict[str, torch.Tensor], forward_context: dict,
                  runner_kv_caches: list[torch.Tensor], num_attn_module: int = 1) -> None:
    from vllm.model_executor.models.utils import extract_layer_index

    assert len(runner_kv_caches) == 0
    by_index: dict[int, list[str]] = defaultdict(list)
    for name in kv_caches:
        by_index[extract_layer_index(name, num_attn_module)].append(name)
    for index in sorted(by_index):
        runner_kv_caches.extend(kv_caches[name] for name in by_index[index])
    for name, kv_cache in kv_caches.items():
        forward_context[name].kv_cache = kv_cache


def apply() -> None:
    import vllm.v1.worker.gpu_model_runner as runner

    runner.bind_kv_cache = bind_kv_cache
