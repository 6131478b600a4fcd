"""P3: repetition penalties without vLLM's compiled `_C` (see the catalog)."""
from __future__ import annotations


def apply() -> None:
    import vllm._custom_ops as ops

    ops.apply_repetition_penalties = ops.apply_repetition_penalties_torch
