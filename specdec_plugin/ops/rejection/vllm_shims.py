"""Drop-in replacements for the four Triton kernels of ``vllm/v1/sample/rejection_sampler.py``.

Each adapter takes the exact arguments vLLM 0.26 launches the kernel with (parameter names are
vLLM's, so keyword launches bind too; constexpr block sizes and launch options are ignored) and
calls our kernel through the registry. ``shim_table(providers)`` maps
``(vllm module, symbol)`` -> shim for the patch module to install.
"""
from __future__ import annotations

from specdec_plugin.ops.registry import get_kernel
from specdec_plugin.ops.spec_prep.kernel_shim import VllmKernelShim

_MODULE = "vllm.v1.sample.rejection_sampler"


def _greedy_adapter(providers):
    def launch(
        grid, output_token_ids_ptr, cu_num_draft_tokens_ptr, draft_token_ids_ptr,
        target_argmax_ptr, bonus_token_ids_ptr, is_greedy_ptr, max_spec_len,
        uniform_probs_ptr=None, synthetic_conditional_rates_ptr=None, SYNTHETIC_MODE=False,
        **_launch_options,
    ):
        get_kernel("rejection_greedy_sample", providers)(
            output_token_ids_ptr[: grid[0]], cu_num_draft_tokens_ptr, draft_token_ids_ptr,
            target_argmax_ptr, bonus_token_ids_ptr, is_greedy_ptr, int(max_spec_len),
            uniform_probs_ptr if SYNTHETIC_MODE else None,
            synthetic_conditional_rates_ptr if SYNTHETIC_MODE else None,
        )
    return launch


def _random_adapter(providers):
    def launch(
        grid, output_token_ids_ptr, cu_num_draft_tokens_ptr, draft_token_ids_ptr,
        draft_probs_ptr, target_probs_ptr, bonus_token_ids_ptr, recovered_token_ids_ptr,
        uniform_probs_ptr, is_greedy_ptr, max_spec_len, vocab_size,
        synthetic_conditional_rates_ptr=None, NO_DRAFT_PROBS=False, SYNTHETIC_MODE=False,
        **_launch_options,
    ):
        get_kernel("rejection_random_sample", providers)(
            output_token_ids_ptr[: grid[0]], cu_num_draft_tokens_ptr, draft_token_ids_ptr,
            None if NO_DRAFT_PROBS else draft_probs_ptr, target_probs_ptr, bonus_token_ids_ptr,
            recovered_token_ids_ptr, uniform_probs_ptr, is_greedy_ptr, int(max_spec_len),
            synthetic_conditional_rates_ptr if SYNTHETIC_MODE else None,
        )
    return launch


def _expand_adapter(providers):
    def launch(
        grid, output_ptr, input_ptr, cu_num_tokens_ptr, replace_from, replace_to,
        MAX_NUM_TOKENS=None, **_launch_options,
    ):
        get_kernel("expand_batch_to_tokens", providers)(
            output_ptr, input_ptr[: grid[0]], cu_num_tokens_ptr[: grid[0]], replace_from,
            replace_to,
        )
    return launch


def _recovered_adapter(providers):
    def launch(
        grid, output_token_ids_ptr, cu_num_draft_tokens_ptr, draft_token_ids_ptr,
        draft_probs_ptr, target_probs_ptr, inv_q_ptr, vocab_size, BLOCK_SIZE=None,
        NO_DRAFT_PROBS=False, USE_FP64_GUMBEL=False, **_launch_options,
    ):
        get_kernel("sample_recovered_tokens", providers)(
            output_token_ids_ptr, cu_num_draft_tokens_ptr[: grid[0]], draft_token_ids_ptr,
            None if NO_DRAFT_PROBS else draft_probs_ptr, target_probs_ptr, inv_q_ptr[: grid[0]],
        )
    return launch


def shim_table(providers: tuple[str, ...] = ("torch",)) -> dict[tuple[str, str], VllmKernelShim]:
    """``{(vllm module path, symbol): shim}`` for every rejection-sampler Triton kernel."""
    adapters = {
        "rejection_greedy_sample_kernel": _greedy_adapter,
        "rejection_random_sample_kernel": _random_adapter,
        "expand_kernel": _expand_adapter,
        "sample_recovered_tokens_kernel": _recovered_adapter,
    }
    return {
        (_MODULE, symbol): VllmKernelShim(make(tuple(providers)), symbol)
        for symbol, make in adapters.items()
    }
