"""A draft model cut from the target: some of SmolLM2's own layers at its full width.

The first draft model (2 layers, 144 wide, own embedding) stayed at an acceptance length of
about 1.45 through every retraining (issue 17's bar: 2.2). Untrained, even 25 of the target's
30 layers read under 1.8 (session 21, ``layer_subset_drafts.py``), so a subset needs training;
but starting from the target's layers, norm and embedding gives it the target's own features
and output space from the first step.

What this builds: a Llama of the target's shape with ``len(layer_ids)`` layers, layer j a copy
of target layer ``layer_ids[j]``, the target's final norm, and the target's tied embedding.

The embedding (and with it the tied LM head) **stays frozen and is not shipped**: it is the
target's, 28M of the model's parameters, and ``specdec_plugin.models.drafters`` copies it from
the target's checkpoint when it materializes the draft for vLLM. A shipped draft-model file
without ``model.embed_tokens.weight`` is one of these.
"""
from __future__ import annotations

import torch

from specdec_plugin.models.drafters import TARGET_EMBEDDING as EMBEDDING
from training import configs

# Set on a module whose embedding is the target's: its export leaves the embedding out.
SHARES_TARGET_EMBEDDING = "specdec_shares_target_embedding"


def config_for(layers: int) -> dict:
    t = configs.TARGET
    return configs.draft_model_config(t["hidden"], layers, t["inter"], t["heads"])


def parse_layer_ids(text: str, target_layers: int = configs.TARGET["layers"]) -> list[int]:
    """``"0,10,20,29"`` -> [0, 10, 20, 29]; each id a target layer, in increasing order."""
    ids = [int(x) for x in text.split(",") if x.strip()]
    if not ids or any(not 0 <= i < target_layers for i in ids) or ids != sorted(set(ids)):
        raise ValueError(f"draft layers {text!r}: want increasing, distinct target layer ids "
                         f"in [0, {target_layers})")
    return ids


def share_target_embedding(model, embedding: torch.Tensor) -> None:
    """Give ``model`` the target's embedding (tied LM head), frozen, and mark it as shared."""
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embedding.to(model.model.embed_tokens.weight))
    model.tie_weights()
    model.model.embed_tokens.weight.requires_grad_(False)
    setattr(model, SHARES_TARGET_EMBEDDING, True)


def build(target, layer_ids: list[int]):
    """A float32 draft model from ``target`` (a transformers Llama) as the module doc says."""
    model = configs.llama_from_config(config_for(len(layer_ids)))
    source = target.model
    with torch.no_grad():
        for j, i in enumerate(layer_ids):
            state = {k: v.float().cpu() for k, v in source.layers[i].state_dict().items()}
            model.model.layers[j].load_state_dict(state)
        model.model.norm.weight.copy_(source.norm.weight.float().cpu())
    share_target_embedding(model, source.embed_tokens.weight.detach().float().cpu())
    return model


def shares_target_embedding(model) -> bool:
    return bool(getattr(model, SHARES_TARGET_EMBEDDING, False))
