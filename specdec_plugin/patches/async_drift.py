"""P14: the runner's computed-token correction under async speculative decoding, without
``torch.compile`` (see the catalog and ops/async_drift)."""
from __future__ import annotations

from specdec_plugin.ops.registry import get_kernel

# The name the V1 runner calls, imported into its module by name.
TARGET = ("vllm.v1.worker.gpu_model_runner", "update_num_computed_tokens_for_batch_change")


def apply(kernel_providers: tuple[str, ...]) -> None:
    import importlib

    module, name = TARGET
    setattr(importlib.import_module(module), name,
            get_kernel("correct_computed_tokens", tuple(kernel_providers)))
