"""Kernel registry: every device kernel by name, with one implementation per provider.

Each op lives in its own package under ``specdec_plugin/ops/<op>/`` with a pure-torch
``reference.py`` (always present, runs anywhere) and, where written, a ``triton.py`` with the
same signature. The table below maps op name -> provider -> "module:function"; modules are
imported only when a provider is asked for, so the CPU path never imports Triton.

Every provider of an op calls the op's validator (``ops/<folder>/validate.py``) first, so none
accepts inputs another rejects; ``tests/ops/test_<folder>.py`` compares every provider listed
here with the torch reference.

The device layer (``specdec_plugin.device``) says which providers it prefers, in order;
``get_kernel`` returns the first one the op has. Adding a kernel means one line here.
"""
from __future__ import annotations

import importlib
from functools import lru_cache
from typing import Callable, Sequence

_OPS = "specdec_plugin.ops"

KERNELS: dict[str, dict[str, str]] = {
    # attention over a paged KV cache, prefill / decode / 1+K verification
    "paged_attention": {
        "torch": f"{_OPS}.paged_attention.reference:paged_attention",
        "triton": f"{_OPS}.paged_attention.triton:paged_attention",
        "cpp": f"{_OPS}.paged_attention.cpp:paged_attention",
    },
    # the query tokens' KV write, then attention: one launch in Triton (issue 12; the CUDA
    # attention layers use it with SPECDEC_FUSED_KV_WRITE=1)
    "paged_attention_write_kv": {
        "torch": f"{_OPS}.paged_attention.reference:paged_attention_write_kv",
        "triton": f"{_OPS}.paged_attention.triton:paged_attention_write_kv",
    },
    # split-KV workspace sized before graph capture (a no-op for the torch reference)
    "paged_attention_workspace": {
        "torch": f"{_OPS}.paged_attention.reference:reserve_workspace",
        "triton": f"{_OPS}.paged_attention.triton:reserve_workspace",
        "cpp": f"{_OPS}.paged_attention.cpp:reserve_workspace",
    },
    "reshape_and_cache": {
        "torch": f"{_OPS}.reshape_and_cache.reference:reshape_and_cache",
        "triton": f"{_OPS}.reshape_and_cache.triton:reshape_and_cache",
        "cpp": f"{_OPS}.reshape_and_cache.cpp:reshape_and_cache",
    },
    # speculative decoding: rejection sampler (vLLM rejection_sampler.py kernels)
    "rejection_greedy_sample": {
        "torch": f"{_OPS}.rejection.reference:rejection_greedy_sample",
        "triton": f"{_OPS}.rejection.triton:rejection_greedy_sample",
    },
    "rejection_random_sample": {
        "torch": f"{_OPS}.rejection.reference:rejection_random_sample",
        "triton": f"{_OPS}.rejection.triton:rejection_random_sample",
    },
    "sample_recovered_tokens": {
        "torch": f"{_OPS}.rejection.reference:sample_recovered_tokens",
        "triton": f"{_OPS}.rejection.triton:sample_recovered_tokens",
    },
    "expand_batch_to_tokens": {
        "torch": f"{_OPS}.rejection.reference:expand_batch_to_tokens",
        "triton": f"{_OPS}.rejection.triton:expand_batch_to_tokens",
    },
    # async speculative decoding: each request's computed tokens corrected on the device
    # (patch P14, in place of vLLM's torch.compile'd function)
    "correct_computed_tokens": {
        "torch": f"{_OPS}.async_drift.reference:correct_computed_tokens",
        "triton": f"{_OPS}.async_drift.triton:correct_computed_tokens",
    },
    # speculative decoding: KV slot mapping and EAGLE/MTP input preparation
    "compute_slot_mapping": {
        "torch": f"{_OPS}.spec_prep.reference:compute_slot_mapping",
        "triton": f"{_OPS}.spec_prep.triton:compute_slot_mapping",
    },
    "eagle_step_slot_mapping_metadata": {
        "torch": f"{_OPS}.spec_prep.reference:eagle_step_slot_mapping_metadata",
        "triton": f"{_OPS}.spec_prep.triton:eagle_step_slot_mapping_metadata",
    },
    "eagle_prepare_inputs_padded": {
        "torch": f"{_OPS}.spec_prep.reference:eagle_prepare_inputs_padded",
        "triton": f"{_OPS}.spec_prep.triton:eagle_prepare_inputs_padded",
    },
    "eagle_prepare_next_token_padded": {
        "torch": f"{_OPS}.spec_prep.reference:eagle_prepare_next_token_padded",
        "triton": f"{_OPS}.spec_prep.triton:eagle_prepare_next_token_padded",
    },
    "copy_and_expand_eagle_inputs": {
        "torch": f"{_OPS}.spec_prep.reference:copy_and_expand_eagle_inputs",
        "triton": f"{_OPS}.spec_prep.triton:copy_and_expand_eagle_inputs",
    },
    # speculative decoding: n-gram prompt lookup on the device (the C++ index on the host)
    "ngram_match": {
        "torch": f"{_OPS}.ngram_match.reference:ngram_match",
        "triton": f"{_OPS}.ngram_match.triton:ngram_match",
    },
    # ... and each n-gram step's next tokens, valid counts and history append in one launch
    "ngram_step_update": {
        "torch": f"{_OPS}.ngram_update.reference:ngram_step_update",
        "triton": f"{_OPS}.ngram_update.triton:ngram_step_update",
    },
    # speculative decoding: a drafter batch padded to a recorded graph's shape
    "pad_drafter_batch": {
        "torch": f"{_OPS}.drafter_pad.reference:pad_drafter_batch",
        "triton": f"{_OPS}.drafter_pad.triton:pad_drafter_batch",
    },
    # a few token rows times a whole weight on the GPU (patches/gpu_linear.py, issue 12)
    "skinny_gemm": {
        "torch": f"{_OPS}.skinny_gemm.reference:skinny_gemm",
        "triton": f"{_OPS}.skinny_gemm.triton:skinny_gemm",
    },
    # linear layers and the LM head on the CPU (patches/cpu_linear.py): the weight packed once
    # at load by pack_linear_weight, then linear every step, both from one provider (the
    # packed weight names it). cpp: bfloat16/float32 weights widened to float32, row invariant;
    # torch_widened: its reference (ops/linear/widened_reference.py)
    "pack_linear_weight": {
        "torch": f"{_OPS}.linear.reference:pack_linear_weight",
        "onednn": f"{_OPS}.linear.onednn:pack_linear_weight",
        "cpp": f"{_OPS}.linear.cpp:pack_linear_weight",
        "torch_widened": f"{_OPS}.linear.widened_reference:pack_linear_weight",
    },
    "linear": {
        "torch": f"{_OPS}.linear.reference:linear",
        "onednn": f"{_OPS}.linear.onednn:linear",
        "cpp": f"{_OPS}.linear.cpp:linear",
        "torch_widened": f"{_OPS}.linear.widened_reference:linear",
    },
    # model layers: vLLM's RMSNorm / RotaryEmbedding / SiluAndMul (ops/custom_ops.py); cpp:
    # one C++ call each on the CPU (csrc/cpu_layer_ops.cpp)
    "rms_norm": {
        "torch": f"{_OPS}.rms_norm.reference:rms_norm",
        "triton": f"{_OPS}.rms_norm.triton:rms_norm",
        "cpp": f"{_OPS}.rms_norm.cpp:rms_norm",
    },
    "rotary_embedding": {
        "torch": f"{_OPS}.rotary.reference:apply_rotary",
        "triton": f"{_OPS}.rotary.triton:apply_rotary",
        "cpp": f"{_OPS}.rotary.cpp:apply_rotary",
    },
    "silu_and_mul": {
        "torch": f"{_OPS}.activation.reference:silu_and_mul",
        "triton": f"{_OPS}.activation.triton:silu_and_mul",
        "cpp": f"{_OPS}.activation.cpp:silu_and_mul",
    },
}


# Providers whose kernels never synchronise with the host, so they can run inside graphs.
GRAPH_SAFE_PROVIDERS = frozenset({"triton"})


def has_graph_safe_kernel(op: str, providers: Sequence[str]) -> bool:
    """True if the provider ``get_kernel`` would pick for ``op`` can be captured in a graph."""
    impls = KERNELS.get(op, {})
    chosen = next((p for p in (*providers, "torch") if p in impls), None)
    return chosen in GRAPH_SAFE_PROVIDERS


def op_folder(op: str) -> str:
    """The ``ops/<folder>/`` package that implements ``op`` (its tests: tests/ops/test_<folder>.py)."""
    module = KERNELS[op]["torch"].partition(":")[0]
    return module[len(_OPS) + 1:].partition(".")[0]


def _load(path: str) -> Callable:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@lru_cache(maxsize=None)
def get_kernel(op: str, providers: Sequence[str] = ("torch",)) -> Callable:
    """Return the implementation of ``op`` from the first provider in ``providers`` that has it.

    ``providers`` must be a tuple (it is a cache key). The torch reference is always the last
    resort, so a device with no kernel of its own for ``op`` still runs.
    """
    try:
        impls = KERNELS[op]
    except KeyError:
        raise KeyError(f"unknown kernel {op!r}; known: {sorted(KERNELS)}") from None
    for provider in (*providers, "torch"):
        if provider in impls:
            return _load(impls[provider])
    raise KeyError(f"kernel {op!r} has no implementation for providers {providers}")
