"""Compile at engine start the kernel variants that serving launches: attention's
(``compile_attention_variants``), the speculative step's (``compile_spec_decode_kernels``) and
the skinny GEMM's when patch P16 is on (``compile_linear_variants``).

A Triton kernel compiles once per set of constexpr values, and a compile in the middle of
serving stalls that step for a second or more. Our paged attention kernel
(ops/paged_attention/triton.py) has six variants: query tile 1 (decode, drafting), the
verification tile and the largest tile (prefill), each with and without a KV split. Graph
capture compiles only what its graphs record. Eager steps reach the rest: mixed prefill-decode
batches, prefills whose prefix is cached (a short query over a long context is split), and
drafting outside our graphs. Seen on the H100, 2026-11-25: with one warm-up run, the first
timed run at batch 1 took 1.74 s against 0.80 s, because a split prefill variant compiled
inside it.

So each variant is launched once here, on one request over the KV cache's null block. The
inputs have the same dtypes and the same stride classes as the live ones (Triton also
specialises integers by divisibility by 16): the layer's own cache, and a block table as wide
as the runner's.
"""
from __future__ import annotations

import torch

from specdec_plugin.attention.impl import SpecDecAttentionImpl
from specdec_plugin.log import init_logger

logger = init_logger(__name__)

# A plan length that makes the kernel split the KV of a single short query (one tile); the
# split heuristic reads only this host value.
_SPLIT_PLAN_SEQ_LEN = 1 << 20


def _block_table_width(runner, block_size: int) -> int:
    try:
        return int(runner.input_batch.block_table[0].max_num_blocks_per_req)
    except (AttributeError, IndexError, TypeError):
        return -(-runner.model_config.max_model_len // block_size)


def compile_attention_variants(runner) -> int:
    """Launch every attention variant once per distinct layer shape; returns the launches.
    Only for devices whose kernels compile at first use (the Triton provider)."""
    from specdec_plugin.ops.paged_attention.triton import variant_query_lengths

    layers = runner.compilation_config.static_forward_context
    seen: set[tuple] = set()
    launches = 0
    for layer in layers.values():
        impl = getattr(layer, "impl", None)
        kv_cache = getattr(layer, "kv_cache", None)
        if not isinstance(impl, SpecDecAttentionImpl) or not isinstance(kv_cache, torch.Tensor):
            continue
        if kv_cache.dim() != 5:  # [2, blocks, block_size, kv_heads, head] once allocated
            continue
        dtype = getattr(layer, "dtype", None) or runner.model_config.dtype
        shape = (impl.num_heads, impl.num_kv_heads, impl.head_size, kv_cache.dtype, dtype,
                 kv_cache.shape[2])
        if shape in seen:
            continue
        seen.add(shape)
        key_cache, value_cache = kv_cache.unbind(0)
        device = kv_cache.device
        width = _block_table_width(runner, kv_cache.shape[2])
        block_table = torch.zeros(1, width, dtype=torch.int32, device=device)  # null block
        for q in variant_query_lengths(impl.num_heads, impl.num_kv_heads):
            query = torch.randn(q, impl.num_heads, impl.head_size, dtype=dtype, device=device)
            out = torch.empty_like(query)
            query_start_loc = torch.tensor([0, q], dtype=torch.int32, device=device)
            seq_lens = torch.tensor([q], dtype=torch.int32, device=device)
            # Unsplit: planned as a host-bound launch, whose split threshold (1,024 keys) no
            # warm-up query reaches. Planned normally, the largest tile of ungrouped heads (one
            # query head per KV head: a 128-token query, 3 programs for the draft model's 3/3
            # heads) splits in two, and its unsplit variant was left to compile at the first
            # prefill (H100, session 26).
            # Split: planned for a context long enough to split any single tile.
            for host_bound, plan_seq_len in ((True, 0), (False, _SPLIT_PLAN_SEQ_LEN)):
                impl._attention(query, key_cache, value_cache, block_table, query_start_loc,
                                seq_lens, impl.scale, out, q, q, host_bound=host_bound,
                                plan_seq_len=plan_seq_len)
                launches += 1
                if impl.writes_kv_in_forward:  # SPECDEC_FUSED_KV_WRITE: its own variants
                    new_kv = torch.randn(q, impl.num_kv_heads, impl.head_size, dtype=dtype,
                                         device=device)
                    no_slots = torch.full((q,), -1, dtype=torch.int64, device=device)
                    impl._attention_write_kv(query, new_kv, new_kv, key_cache, value_cache,
                                             no_slots, block_table, query_start_loc, seq_lens,
                                             impl.scale, out, q, q, host_bound=host_bound,
                                             plan_seq_len=plan_seq_len)
                    launches += 1
    return launches  # compiled on the host at launch: nothing to wait for


def compile_spec_decode_kernels(runner) -> list[str]:
    """Launch once, at start-up, the speculative kernels a served step needs and that vLLM's
    own warm-up does not reach; returns the ops launched. Only for Triton-provider devices.

    Seen on the H100 (JIT monitor, 2026-11-25): every EAGLE, EAGLE-3, MTP and draft-model engine
    compiled ``_greedy_kernel``, ``_next_token_padded_kernel`` and
    ``_prepare_inputs_padded_kernel`` at its first request (n-gram and suffix engines the
    greedy kernel alone), about a second that request waits. vLLM's V1 sampler warm-up runs the rejection sampler with
    temperature 0.5 only (the greedy kernel's mixed-batch variant), and its drafters' input
    preparation runs first inside ``propose``. The launches below use the live calls' argument
    dtypes (those the JIT monitor printed) on one request, so they compile the same variants.
    Called from ``capture_model``: engines without graphs (``enforce_eager``) still compile
    these at their first request, as they do the attention variants.
    """
    spec = getattr(runner, "speculative_config", None)
    if spec is None:
        return []
    from types import SimpleNamespace

    from specdec_plugin.ops.registry import get_kernel
    from specdec_plugin.spec_decode.rejection_sampler import rejection_sample

    providers = tuple(runner.device_layer.kernel_providers)
    device, k = runner.device, int(spec.num_speculative_tokens)
    vocab = int(runner.model_config.get_vocab_size())
    launched = []

    # All-greedy batches (temperature 0 everywhere: no is_greedy mask). Adaptive drafting
    # verifies 1..K drafts per step; the kernel's block follows the longest.
    rates = getattr(getattr(runner, "rejection_sampler", None), "synthetic_conditional_rates", None)
    all_greedy = SimpleNamespace(all_greedy=True, all_random=False, generators={}, temperature=None)
    for drafts in range(1, k + 1):
        draft_ids = torch.randint(0, vocab, (drafts,), dtype=torch.int32, device=device)
        logits = torch.randn(drafts, vocab, dtype=torch.float32, device=device)
        bonus = torch.randint(0, vocab, (1, 1), dtype=torch.int32, device=device)
        cu = torch.tensor([drafts], dtype=torch.int32, device=device)
        rejection_sample(draft_ids, [drafts], drafts, cu, None, logits, bonus, all_greedy,
                         synthetic_conditional_rates=rates, providers=providers)
    launched.append("rejection_greedy_sample")

    # Async speculative decoding corrects the computed-token counts every step (patch P14).
    # Two launches: the previous batch's valid counts come as int32 or int64 depending on the
    # proposer's path, and a pointer's element type is part of the compiled variant.
    if getattr(runner, "use_async_spec_decode", False):
        correct = get_kernel("correct_computed_tokens", providers)
        for valid_dtype in (torch.int32, torch.int64):
            correct(torch.zeros_like(runner.num_computed_tokens[:2]),
                    torch.zeros_like(runner.num_accepted_tokens.gpu[:1]),
                    torch.zeros_like(runner.prev_positions.gpu[:1]),
                    torch.ones(1, dtype=valid_dtype, device=device),
                    torch.ones_like(runner.prev_num_draft_tokens.gpu[:2]),
                    torch.ones(1, dtype=torch.int32, device=device))
        launched.append("correct_computed_tokens")

    # The padded drafter batch's input preparation (EAGLE family and draft model), for plain
    # steps (1 sampled column) and every verification width up to 1+K.
    if hasattr(getattr(runner, "drafter", None), "prepare_next_token_ids_padded"):
        for cols in range(1, k + 2):
            sampled = torch.randint(0, vocab, (1, cols), dtype=torch.int32, device=device)
            get_kernel("eagle_prepare_next_token_padded", providers)(
                sampled, torch.zeros(1, dtype=torch.bool, device=device),
                torch.zeros(1, dtype=torch.int32, device=device),
                torch.empty(1, dtype=torch.int32, device=device),
                torch.empty(1, dtype=torch.int32, device=device), vocab, cols, 1)
        get_kernel("eagle_prepare_inputs_padded", providers)(
            torch.tensor([k], dtype=torch.int32, device=device),
            torch.tensor([k + 1], dtype=torch.int32, device=device),
            torch.tensor([0, k + 1], dtype=torch.int32, device=device),
            torch.empty(1, dtype=torch.int32, device=device),
            torch.empty(1, dtype=torch.int32, device=device), 1)
        launched += ["eagle_prepare_next_token_padded", "eagle_prepare_inputs_padded"]
        if k > 1:
            _launch_eagle_step(runner, providers, device)
            launched.append("eagle_step_slot_mapping_metadata")
    return launched


def _launch_eagle_step(runner, providers, device) -> None:
    """The drafter's per-step position and slot update, which vLLM launches between draft
    tokens 2..K. Seen on the H100 (session 18, JIT monitor): an EAGLE-3 engine compiled
    ``_eagle_step_kernel`` at its first batch-1 request, after start-up; drafting steps that
    replay a recorded graph never reach it at start. Live classes (vLLM's
    ``_update_positions_dependent_metadata``): int64 positions and slots, int32 sequence
    lengths, and the runner's int32 block table, as wide as its rows."""
    from specdec_plugin.ops.registry import get_kernel

    block_size = int(runner.cache_config.block_size)
    width = _block_table_width(runner, block_size)
    get_kernel("eagle_step_slot_mapping_metadata", providers)(
        torch.zeros(1, dtype=torch.int64, device=device),
        torch.zeros(1, width, dtype=torch.int32, device=device),  # the null block
        torch.ones(1, dtype=torch.int32, device=device),
        torch.empty(1, dtype=torch.int64, device=device),
        torch.empty(1, dtype=torch.int64, device=device),
        block_size, int(runner.model_config.max_model_len), 1, 1)


def compile_linear_variants(runner) -> list[str]:
    """P16's skinny GEMM once per weight shape of the target and of the drafter, when the
    patch is installed (``SPECDEC_SKINNY_GEMM=1``); returns what was launched. Graph capture
    runs only the products of the sizes it records; one the start-up never reached (a
    drafter's LM head outside its graphs, say) would compile at its first request."""
    from specdec_plugin.patches import gpu_linear

    models = [model for model in (runner.get_model(), runner.get_draft_model())
              if model is not None]
    shapes = gpu_linear.compile_variants(models)
    return [f"skinny_gemm ({shapes} weight shapes)"] if shapes else []
