"""Drafter weights in and out of the training stage: resume from carried files, export.

Resuming reads either layout, plain bf16 or int8-packed (``specdec_format`` metadata, see
``specdec_plugin.models.drafters``), through the loader the plugin itself uses:
- a device run's output: ``DIR/<kind>.safetensors`` with the config JSON in its metadata;
- the shipped assets: ``DIR/<kind>/model.safetensors`` + ``config.json`` (MTP:
  ``mtp_layer.safetensors`` + ``mtp_config.json``), e.g. ``specdec_plugin/assets/drafters``.
Only weights travel: optimizer state starts fresh on every resume (AdamW's moments rebuild
within the warm-up; the learning-rate schedule restarts over the new call's budget).

Export writes ``<kind>.safetensors`` with its config in the metadata, bf16, unless the file
would exceed ``max_bytes`` (a device call returns files of at most 16 MiB): then its matrices
are packed int8 row-wise exactly as ``training/pack_int8.py`` packs the shipped assets.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from training import configs, draft_from_target
from training.heads import head_from_tensors

FILE_LIMIT_BYTES = 16 * 1024 * 1024 - 64 * 1024  # the device's per-file limit, less headroom


def find_init_file(init_dir: Path, kind: str) -> tuple[Path, dict] | None:
    """(weights file, config) for ``kind`` under ``init_dir``, or None if it has none."""
    init_dir = Path(init_dir)
    flat = init_dir / f"{kind}.safetensors"
    if flat.exists():
        from safetensors import safe_open

        with safe_open(str(flat), "pt") as handle:
            return flat, json.loads(handle.metadata()["config"])
    weights, config = (("mtp_layer.safetensors", "mtp_config.json") if kind == "mtp"
                       else ("model.safetensors", "config.json"))
    if (init_dir / kind / weights).exists():
        return init_dir / kind / weights, json.loads((init_dir / kind / config).read_text())
    return None


def load_tensors(path: Path) -> dict:
    """A drafter file's tensors under vLLM's names, int8 matrices dequantized to bf16."""
    from safetensors import safe_open

    from specdec_plugin.models.drafters import dequantize_tensors

    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    return dequantize_tensors(tensors, metadata)


def draft_model_from_tensors(config: dict, tensors: dict, target_embedding=None):
    """A float32 draft model; a file without an embedding (``draft_from_target``) takes the
    target's, frozen, from ``target_embedding``."""
    model = configs.llama_from_config(config)
    state = {k: v.float() for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # lm_head is tied to the embedding and not stored.
    shares_target_embedding = draft_from_target.EMBEDDING not in tensors
    if shares_target_embedding and target_embedding is None:
        raise ValueError("this draft model's file has no embedding (it is the target's): "
                         "pass target_embedding")
    allowed = {"lm_head.weight"} | ({draft_from_target.EMBEDDING} if shares_target_embedding
                                    else set())
    assert set(missing) <= allowed and not unexpected, (missing, unexpected)
    model.tie_weights()
    if shares_target_embedding:
        draft_from_target.share_target_embedding(model, target_embedding)
    return model


def load_for_resume(init_dir: Path | None, kind: str, want_config: dict | None, log,
                    target_embedding=None):
    """The carried drafter of ``kind`` as a float32 module, or None (start fresh). A draft
    model of another shape than ``want_config`` is not resumed; one cut from the target gets
    ``target_embedding`` back."""
    if init_dir is None:
        return None
    found = find_init_file(init_dir, kind)
    if found is None:
        log(f"resume: no {kind} under {init_dir}; starting fresh")
        return None
    path, config = found
    tensors = load_tensors(path)
    if kind == "draft_model":
        keys = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads")
        if want_config and any(config.get(k) != want_config.get(k) for k in keys):
            log(f"resume: draft_model in {path} has shape "
                f"{ {k: config.get(k) for k in keys} }, want { {k: want_config[k] for k in keys} }; "
                "starting fresh")
            return None
        module = draft_model_from_tensors(config, tensors, target_embedding)
    elif kind == "eagle3":
        from specdec_plugin.models.padded_drafters import eagle3_aux_layer_ids

        module = head_from_tensors(kind, tensors, aux_layers=eagle3_aux_layer_ids(config)).float()
    else:
        module = head_from_tensors(kind, tensors).float()
    log(f"resume: {kind} from {path} ({sum(p.numel() for p in module.parameters())} params)")
    return module


def drafter_tensors(kind: str, module) -> tuple[dict, dict]:
    """(tensors under vLLM's names, config dict) of a trained drafter."""
    if kind == "draft_model":
        cfg = module.config
        config = configs.draft_model_config(cfg.hidden_size, cfg.num_hidden_layers,
                                            cfg.intermediate_size, cfg.num_attention_heads)
        # The target's embedding is not shipped: materialization copies it from the target.
        left_out = {"lm_head.weight"} | ({draft_from_target.EMBEDDING}
                                         if draft_from_target.shares_target_embedding(module)
                                         else set())
        sd = {k: v for k, v in module.state_dict().items() if k not in left_out}
        return sd, config
    config = configs.eagle3_config(len(module.vocab_ids), module.mlp.gate_proj.out_features,
                                   module.attention_layers, module.aux_layers) \
        if kind == "eagle3" \
        else configs.CONFIGS[kind]()
    return module.export_tensors(), config


def save_drafter(kind: str, module, path: Path, max_bytes: int = FILE_LIMIT_BYTES) -> dict:
    """Write ``path`` (bf16, or int8-packed when bf16 would not fit ``max_bytes``)."""
    from safetensors.torch import save_file

    from specdec_plugin.models.drafters import PACKED_FORMAT, QWEIGHT_SUFFIX, SCALE_SUFFIX
    from training.pack_int8 import quantize_rowwise, should_pack

    tensors, config = drafter_tensors(kind, module)
    clean = {}
    for name, t in tensors.items():
        t = t.detach().cpu()
        clean[name] = (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous()
    metadata = {"format": "pt", "config": json.dumps(config)}
    bf16_bytes = sum(t.numel() * t.element_size() for t in clean.values())
    packed = bf16_bytes > max_bytes
    if packed:
        out = {}
        for name, t in clean.items():
            if should_pack(t):
                out[name + QWEIGHT_SUFFIX], out[name + SCALE_SUFFIX] = quantize_rowwise(t)
            else:
                out[name] = t
        clean = out
        metadata["specdec_format"] = PACKED_FORMAT
    save_file(clean, str(path), metadata=metadata)
    return {"bytes": path.stat().st_size, "int8_packed": packed, "bf16_bytes": bf16_bytes}
