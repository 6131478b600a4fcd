"""Sizes, hyper-parameters and the exact vLLM-facing configs of the four drafters.

The config dicts here are what ``specdec_plugin/assets/drafters/<kind>/config.json`` holds; the
device run also stores each one in its safetensors metadata ("config"), so the shipped pair can
never disagree.
"""
from __future__ import annotations

import json

import torch

from training.data import AUX_LAYERS

TARGET = dict(hidden=576, inter=1536, heads=9, kv_heads=3, head_dim=64, vocab=49152,
              eps=1e-5, theta=100000.0, max_pos=8192, layers=30)

DRAFT_HIDDEN, DRAFT_LAYERS, DRAFT_INTER = 144, 2, 512
# Same KV layout as the target (3 KV heads of 64): one KV page size for target and draft.
DRAFT_HEADS, DRAFT_KV_HEADS = 3, 3
EAGLE_INTER = 1536
EAGLE3_INTER = 768
# vLLM splits the draft LM head over tensor-parallel ranks (rows padded to 64) and SmolLM2's only
# tensor-parallel size above 1 is 3 (3 KV heads): a draft vocabulary divides by 3 x 64.
EAGLE3_VOCAB_MULTIPLE = 3 * 64
EAGLE3_DRAFT_VOCAB = 16320  # 85 x 192; covers ~99.3% of session 17's data
# vLLM's default for a 30-layer target, (2, n // 2, n - 3); a list as config.json holds it.
EAGLE3_AUX_LAYERS = list(AUX_LAYERS)

LR = {"draft_model": 3e-3, "eagle": 1e-3, "eagle3": 1e-3, "mtp": 5e-4}
TTT_STEPS = {"eagle": 2, "eagle3": 3, "mtp": 2}
TIME_SHARES = {"draft_model": 0.24, "eagle": 0.22, "eagle3": 0.30, "mtp": 0.24}
HEAD_BATCH, DRAFT_BATCH = 32, 32

_ROPE = {"rope_type": "default", "rope_theta": TARGET["theta"]}
_COMMON = {
    "model_type": "llama", "hidden_act": "silu", "vocab_size": TARGET["vocab"],
    "max_position_embeddings": TARGET["max_pos"], "rms_norm_eps": TARGET["eps"],
    # Both spellings: transformers 5 reads rope_parameters, older readers the top-level key.
    "rope_theta": TARGET["theta"], "rope_parameters": _ROPE,
    "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2,
    "pad_token_id": 2, "torch_dtype": "bfloat16", "dtype": "bfloat16",
}


def draft_model_config(hidden: int = DRAFT_HIDDEN, layers: int = DRAFT_LAYERS,
                       inter: int = DRAFT_INTER, heads: int = DRAFT_HEADS) -> dict:
    # Heads of the target's width (64); KV heads stay 3 x 64, the target's KV page size.
    return {**_COMMON, "architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
            "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": DRAFT_KV_HEADS,
            "head_dim": TARGET["head_dim"], "tie_word_embeddings": True}


def _head_common(inter: int) -> dict:
    return {**_COMMON, "architectures": ["LlamaForCausalLM"], "hidden_size": TARGET["hidden"],
            "intermediate_size": inter, "num_hidden_layers": 1,
            "num_attention_heads": TARGET["heads"], "num_key_value_heads": TARGET["kv_heads"],
            "head_dim": TARGET["head_dim"], "tie_word_embeddings": False}


def eagle_config() -> dict:
    # vLLM wraps it in EAGLEConfig(method="eagle") -> EagleLlamaForCausalLM; embed_tokens and
    # lm_head are absent from the weights, so the target's are shared.
    return _head_common(EAGLE_INTER)


def eagle3_config(draft_vocab: int = EAGLE3_DRAFT_VOCAB, inter: int = EAGLE3_INTER,
                  num_layers: int = 1, aux_layers=EAGLE3_AUX_LAYERS) -> dict:
    # num_layers > 1: vLLM 0.26's llama_eagle3 runs layers 1.. as plain Llama layers.
    config = {**_head_common(inter), "num_hidden_layers": num_layers,
              "draft_vocab_size": draft_vocab,
              "target_hidden_size": TARGET["hidden"], "norm_before_residual": False,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layers),
                               "use_aux_hidden_state": True}}
    if list(aux_layers) != EAGLE3_AUX_LAYERS:
        # vLLM 0.26 reads the taps from this top-level key only
        # (eagle3_utils.get_eagle3_aux_layers_from_config) and otherwise uses the target's
        # default, which is EAGLE3_AUX_LAYERS: the key is written only where it matters.
        config["eagle_aux_hidden_state_layer_ids"] = list(aux_layers)
    return config


def mtp_config() -> dict:
    """What the MTP layer adds to the target's config (the rest is the target's own)."""
    return {"num_nextn_predict_layers": 1, "architectures": ["MiMoForCausalLM"]}


CONFIGS = {"draft_model": draft_model_config, "eagle": eagle_config,
           "eagle3": eagle3_config, "mtp": mtp_config}


def llama_from_config(config: dict):
    """A float32 transformers Llama built from one of our draft-model config dicts."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = {k: v for k, v in config.items()
           if k not in ("architectures", "model_type", "rope_theta", "torch_dtype", "dtype")}
    return LlamaForCausalLM(LlamaConfig(**cfg)).float()


def build_draft_model(target_embedding: torch.Tensor, config: dict | None = None):
    """Small Llama whose tied embedding starts as the target's, projected on its top PCs."""
    config = config or draft_model_config()
    model = llama_from_config(config)
    width = config["hidden_size"]
    emb = target_embedding.float()
    centered = emb - emb.mean(0, keepdim=True)
    # Top right-singular vectors via the small d x d covariance.
    _, vecs = torch.linalg.eigh(centered.T @ centered)
    proj = vecs[:, -width:]
    with torch.no_grad():
        init = emb @ proj
        # Same direction as the target's rows, at the usual init scale (std 0.02).
        init = init / init.std() * 0.02
        model.model.embed_tokens.weight.copy_(init.to(model.model.embed_tokens.weight))
    return model


def init_head(kind: str, head, target) -> None:
    """Start EAGLE-3's head from the target's rows and MTP's block from the last target layer."""
    with torch.no_grad():
        if kind == "eagle3":
            ids = head.vocab_ids.to(target.model.embed_tokens.weight.device)
            head.lm_head.weight.copy_(target.model.embed_tokens.weight[ids].float().cpu())
            head.norm.weight.copy_(target.model.norm.weight.float().cpu())
        elif kind == "mtp":
            last = target.model.layers[-1]
            src = {k: v.float().cpu() for k, v in last.state_dict().items()}
            own = head.state_dict()
            for name, value in src.items():
                if name in own and own[name].shape == value.shape:
                    own[name].copy_(value)
            head.final_layernorm.weight.copy_(target.model.norm.weight.float().cpu())


def _save(tensors: dict, path, config: dict) -> None:
    from safetensors.torch import save_file

    clean = {}
    for name, t in tensors.items():
        t = t.detach().cpu()
        clean[name] = (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous()
    save_file(clean, str(path), metadata={"format": "pt", "config": json.dumps(config)})


def save_draft_model(model, path) -> None:
    sd = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    _save(sd, path, draft_model_config())


def save_head(kind: str, head, path) -> None:
    config = CONFIGS[kind]() if kind != "eagle3" else eagle3_config(
        len(head.vocab_ids), head.mlp.gate_proj.out_features, head.attention_layers,
        head.aux_layers)
    _save(head.export_tensors(), path, config)
