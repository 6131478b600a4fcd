"""Prefix-cache hits keep their last block when an EAGLE-family drafter runs.

What vLLM does: with an EAGLE / EAGLE-3 / MTP drafter, every prefix-cache hit gives up its
last matched block (``drop_eagle_block`` in v1/core/single_type_kv_cache_manager.py), and the
target recomputes that block's tokens (16 by default) on top of what plain decoding recomputes.
Why: the drafter's KV at position p comes from the target's hidden state at p and the token at
p + 1 (EAGLE's inputs are shifted by one). A block's hash covers its own tokens only, so at the
hit's last position the cached drafter KV was computed with whatever token followed it in the
request that wrote it. One position may hold KV made from another token; vLLM recomputes a
whole block so that none does.

What it costs: one block of target forward per request that hits the cache (multi-turn chats,
shared system prompts, repeated prompts). On the H100 (session 26; random 7.24B Llama, batch 64,
prompts the warm-up had cached, every draft rejected), EAGLE-3's prefill computed 2,048 tokens
where plain decoding's computed 1,024: about 155 us per decode step of a 128-token answer, the
largest single item the profile found in EAGLE-3's 3.6% over plain decoding there
(benchmarks/trace_steps.py diff). In an A/B run, keeping the block made the fastest of five
runs 1.6% faster at batch 64 (BENCHMARKS.md, session 26).

What we do: keep the block. At most one position of drafter KV per hit then holds KV made from
another request's next token: drafts that attend to it may be worse, and the output is the
target's either way (the same trade as deferred_sync.py's lost kept tokens). Positions before
it were computed from tokens inside the hashed prefix, so they are exact.
``SPECDEC_RECOMPUTE_DRAFTER_BLOCK=1`` keeps vLLM's drop.

Where: only with one KV cache group of full attention (vLLM's ``UnitaryKVCacheCoordinator``
over a ``FullAttentionManager``: a dense target and its drafter). Hybrid models (sliding
window, Mamba) use the drop for alignment of their own caches, and are left as vLLM made them.
Applied by our scheduler (adaptive/scheduler.py) after vLLM's constructor built the KV cache
manager: patch P13 in patches/__init__.py.
"""
from __future__ import annotations

from specdec_plugin.log import init_logger

logger = init_logger(__name__)


def keep_drafter_prefix_blocks(kv_cache_manager, vllm_config) -> bool:
    """Stop the KV cache manager from dropping the last block of prefix-cache hits for an
    EAGLE-family drafter. True when it changed something."""
    from vllm.v1.core.kv_cache_coordinator import UnitaryKVCacheCoordinator
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

    from specdec_plugin import envs

    spec = vllm_config.speculative_config
    if spec is None or not spec.use_eagle() or envs.recompute_drafter_block():
        return False
    coordinator = getattr(kv_cache_manager, "coordinator", None)
    if type(coordinator) is not UnitaryKVCacheCoordinator or not coordinator.eagle_group_ids:
        return False  # no prefix caching, several KV cache groups, or nothing dropped
    manager = coordinator.single_type_managers[0]
    if type(manager) is not FullAttentionManager:
        return False
    coordinator.eagle_group_ids = set()
    # As vLLM's constructor sets it from the group set (kv_cache_coordinator.py).
    manager.use_eagle = False
    logger.info("specdec_plugin: prefix-cache hits keep their last block for the %s drafter "
                "(vLLM recomputes it; SPECDEC_RECOMPUTE_DRAFTER_BLOCK=1 does that)", spec.method)
    return True
