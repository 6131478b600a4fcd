"""A single-layer drafter's KV for deferred tokens, written without the rest of its pass.

Why: a deferred flush (deferred_sync.py) exists only to write the drafter's KV at the kept
positions; vLLM's ``propose`` at k = 0 also runs the layer's attention, o_proj and MLP and
the final norm, whose outputs are thrown away, and on graph devices the padded-graph
bookkeeping around the replay. On an H200 at batch 64 (session 32, SPECDEC_STEP_LOG) that
flush call took 1.1-1.3 ms of host time every fifth step, and the steps after each flush ran
late by about as much: the engine's host work has less than 1 ms of slack there.

What: for an EAGLE-family drafter with one decoder layer, its KV is a function of the layer's
attention input alone: embed the input ids, (EAGLE-3) project the target's auxiliary hidden
states through ``fc`` and the norms, (EAGLE) ``fc`` over embeddings and hidden states side by
side, then ``qkv_proj``, rotary on the keys, and the cache write through the layer's own
attention implementation (``do_kv_cache_update``: the same kernel its forward pass uses). The
modules called are the drafter's own, in the order its ``forward`` calls them, so the KV is
the same as a full pass writes, up to the fusions a compiled graph may make.
tests/test_deferred_sync_engine.py checks the drafts against deferral off for both classes
(CPU, fp32); on an H200 (fp32, drafter graphs) they were equal too (BENCHMARKS.md, session 33).

The attention input of each model class is a small function in a registry keyed by the
drafter's architecture name; a class that is not registered, has more than one layer or a
quantized KV cache keeps the full flush.
"""
from __future__ import annotations

from typing import Callable

import torch

from specdec_plugin.log import init_logger

logger = init_logger(__name__)


def _eagle_llama_attention_input(model, input_ids: torch.Tensor,
                                 hidden: torch.Tensor) -> torch.Tensor:
    # vllm/model_executor/models/llama_eagle.py: LlamaModel.forward, then the first layer's
    # (identity) input norm with no residual yet.
    inner = model.model
    x = inner.fc(torch.cat((inner.embed_tokens(input_ids), hidden), dim=-1))
    return inner.layers[0].input_layernorm(x)


def _eagle3_llama_attention_input(model, input_ids: torch.Tensor,
                                  hidden: torch.Tensor) -> torch.Tensor:
    # vllm/model_executor/models/llama_eagle3.py: the proposer's combine_hidden_states, then
    # the first decoder layer's two norms and the concatenation its qkv_proj reads.
    inner = model.model
    layer = inner.layers[0]
    embeds = layer.input_layernorm(inner.embed_input_ids(input_ids))
    hidden, _ = layer._residual_norm(hidden_states=model.combine_hidden_states(hidden))
    return torch.cat([embeds, hidden], dim=-1)


# The drafter's architecture name (vLLM's resolved class) -> its first layer's attention input.
ATTENTION_INPUTS: dict[str, Callable[..., torch.Tensor]] = {
    "EagleLlamaForCausalLM": _eagle_llama_attention_input,
    "Eagle3LlamaForCausalLM": _eagle3_llama_attention_input,
}


def model_class_name(architecture: str) -> str:
    """The class vLLM loads for a drafter architecture name (several names share a class)."""
    try:
        from vllm.model_executor.models.registry import _SPECULATIVE_DECODING_MODELS
    except ImportError:  # a private table: without it, names are taken as class names
        return architecture
    return _SPECULATIVE_DECODING_MODELS.get(architecture, (None, architecture))[1]


def kv_only_applies(architectures, num_layers: int, kv_cache_dtype: str | None) -> bool:
    """Whether a drafter of these architectures gets KV-only flushes, decided from its config
    before the model is loaded (the deferral's buffers are sized by it)."""
    names = [model_class_name(a) for a in architectures or ()]
    return (len(names) == 1 and names[0] in ATTENTION_INPUTS and num_layers == 1
            and kv_cache_dtype in ("auto", None))


class DrafterKVWriter:
    """Writes the drafter's KV at given positions and slots; see the module docstring."""

    def __init__(self, model: torch.nn.Module,
                 attention_input: Callable[..., torch.Tensor]) -> None:
        self.model = model
        self.attention_input = attention_input
        self.self_attn = model.model.layers[0].self_attn
        self.attn = self.self_attn.attn

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 hidden: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        self_attn, attn = self.self_attn, self.attn
        x = self.attention_input(self.model, input_ids, hidden)
        qkv, _ = self_attn.qkv_proj(x)
        q, k, v = qkv.split([self_attn.q_size, self_attn.kv_size, self_attn.kv_size], dim=-1)
        _, k = self_attn.rotary_emb(positions, q, k)
        attn.impl.do_kv_cache_update(
            attn, k.reshape(-1, attn.num_kv_heads, attn.head_size),
            v.reshape(-1, attn.num_kv_heads, attn.head_size), attn.kv_cache, slot_mapping)


def make_kv_writer(model: torch.nn.Module) -> DrafterKVWriter | None:
    """The writer for a loaded drafter, or None where its layout is not the one registered
    (the caller keeps full flushes)."""
    unwrap = getattr(model, "unwrap", None)  # vLLM's graph wrappers
    if callable(unwrap):
        model = unwrap()
    architecture = type(model).__name__
    attention_input = ATTENTION_INPUTS.get(architecture)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if attention_input is None or layers is None or len(layers) != 1:
        return None
    self_attn = getattr(layers[0], "self_attn", None)
    if self_attn is None or not all(hasattr(self_attn, name) for name in
                                    ("qkv_proj", "rotary_emb", "attn", "q_size", "kv_size")):
        logger.warning("specdec_plugin: drafter %s has no Llama-style attention; deferred "
                       "flushes run its full pass", architecture)
        return None
    return DrafterKVWriter(model, attention_input)
