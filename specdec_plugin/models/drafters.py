"""Trained drafters for SmolLM2-135M-Instruct, as checkpoint directories vLLM 0.26 loads.

Shipped under ``specdec_plugin/assets/drafters/`` (trained on text the target generated itself;
recipe and measured agreement in ``training/README.md``; packed as row-wise int8, see below):

- ``draft_model``: four of the target's own layers (0, 10, 20, 29) at its width, trained as a
  draft; its tied embedding is the target's and is not shipped (``draft_model_tensors`` reads
  it from the target's checkpoint).
- ``eagle``: an EAGLE-1 head (fc 2d->d + one decoder layer); embed/lm_head come from the target.
- ``eagle3``: an EAGLE-3 head (fc over target layers 2/15/27, one decoder layer, own norm and a
  16320-token draft vocabulary with d2t/t2d maps); embeddings come from the target.
- ``mtp``: one MiMo-format MTP layer. vLLM runs MTP only for a target whose architecture has
  it, so ``drafter_checkpoint("mtp")`` builds a full ``MiMoForCausalLM`` checkpoint (SmolLM2's
  weights as Qwen2 with zero q/k/v biases, plus the layer) and that directory is the *target*.

Packed weight format (``specdec_format: "int8-rowwise-v1"`` in the safetensors metadata; written
by ``training/pack_int8.py`` from the trained bf16 files). Each shipped weights file holds, for
every matrix of the drafter (2-D, >= 16,384 elements: embeddings, lm_head, fc, attention and MLP
projections), two tensors in place of ``<name>``:

- ``<name>.qweight``: int8, the matrix's shape, values in [-127, 127];
- ``<name>.scale``: fp16, shape ``[rows]``, ``absmax(row) / 127`` (symmetric, no zero point);

so ``<name> = (qweight.float() * scale.float()[:, None]).to(bfloat16)``. Every other tensor (norms,
biases, EAGLE-3's int64 ``d2t`` and bool ``t2d``) is stored as trained, under its own name. A file
without that metadata key is plain bf16 and is read as is. ``load_shipped_tensors(kind)`` returns
the dequantized bf16 tensors under vLLM's names; the cache checkpoint is plain bf16 safetensors.

``drafter_checkpoint(kind) -> Path`` materializes the directory in the model cache (dequantized
weights, the config, the target's tokenizer files, MiMo for MTP) once per shipped weights file and
loader format (both are in the cache marker); ``speculative_config(kind, n)`` is the dict to hand
vLLM, and ``target_for(kind)`` the target model path to pair it with.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from specdec_plugin.models.cache import build_atomically, cache_root, read_marker
from specdec_plugin.models.smollm2 import fetch_smollm2, sha256_of

KINDS = ("draft_model", "eagle", "eagle3", "mtp")
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets" / "drafters"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "generation_config.json", "special_tokens_map.json")
CACHE_SUBDIR = "drafters"
MTP_WEIGHTS, MTP_CONFIG = "mtp_layer.safetensors", "mtp_config.json"
PACKED_FORMAT = "int8-rowwise-v1"
QWEIGHT_SUFFIX, SCALE_SUFFIX = ".qweight", ".scale"
TARGET_EMBEDDING = "model.embed_tokens.weight"
# Part of the cache marker: bump it when the way shipped files become a checkpoint changes.
CHECKPOINT_BUILD_VERSION = "v2-int8-dequant"


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown drafter kind {kind!r}; expected one of {KINDS}")


def shipped_files(kind: str, assets_dir: str | Path | None = None) -> tuple[Path, Path]:
    """(weights, config) as shipped for ``kind`` (or as laid out under ``assets_dir``, e.g. a
    freshly trained set not installed yet: ``training/eval_acceptance.py``)."""
    _check_kind(kind)
    folder = (Path(assets_dir) if assets_dir is not None else ASSETS_DIR) / kind
    if kind == "mtp":
        return folder / MTP_WEIGHTS, folder / MTP_CONFIG
    return folder / "model.safetensors", folder / "config.json"


def dequantize_rowwise(qweight, scale, dtype=None):
    """``qweight`` (int8 [rows, cols]) times its per-row ``scale`` ([rows]), as ``dtype``."""
    import torch

    restored = qweight.float() * scale.float()[:, None]
    return restored.to(dtype if dtype is not None else torch.bfloat16)


def dequantize_tensors(tensors: dict, metadata: dict | None) -> dict:
    """A shipped file's tensors with every packed ``.qweight``/``.scale`` pair back in bf16."""
    if (metadata or {}).get("specdec_format") != PACKED_FORMAT:
        return dict(tensors)
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(SCALE_SUFFIX) and name[:-len(SCALE_SUFFIX)] + QWEIGHT_SUFFIX in tensors:
            continue
        if name.endswith(QWEIGHT_SUFFIX):
            base = name[:-len(QWEIGHT_SUFFIX)]
            out[base] = dequantize_rowwise(tensor, tensors[base + SCALE_SUFFIX])
        else:
            out[name] = tensor
    return out


def load_shipped_tensors(kind: str, assets_dir: str | Path | None = None) -> dict:
    """The shipped weights of ``kind`` under vLLM's names, matrices dequantized to bf16."""
    from safetensors import safe_open

    weights, _ = shipped_files(kind, assets_dir)
    with safe_open(str(weights), "pt") as handle:
        metadata = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    return dequantize_tensors(tensors, metadata)


def draft_model_tensors(target_dir: Path, assets_dir=None) -> dict:
    """The draft model's tensors under vLLM's names. A draft cut from the target's own layers
    (``training/draft_from_target.py``) ships without its embedding, which is the target's
    (tied, so also its LM head): it is read from the target's checkpoint here."""
    tensors = load_shipped_tensors("draft_model", assets_dir)
    if TARGET_EMBEDDING not in tensors:
        import torch
        from safetensors import safe_open

        with safe_open(str(Path(target_dir) / "model.safetensors"), "pt") as handle:
            tensors[TARGET_EMBEDDING] = handle.get_tensor(TARGET_EMBEDDING).to(torch.bfloat16)
    return tensors


def _copy_tokenizer(target_dir: Path, out_dir: Path) -> None:
    for name in TOKENIZER_FILES:
        if (target_dir / name).exists():
            shutil.copyfile(target_dir / name, out_dir / name)


def _build_plain(kind: str, target_dir: Path, out_dir: Path, assets_dir=None) -> None:
    from safetensors.torch import save_file

    _, config = shipped_files(kind, assets_dir)
    tensors = (draft_model_tensors(target_dir, assets_dir) if kind == "draft_model"
               else load_shipped_tensors(kind, assets_dir))
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(config, out_dir / "config.json")
    if kind == "draft_model":
        _copy_tokenizer(target_dir, out_dir)


def mimo_config(target_config: dict, mtp_config: dict) -> dict:
    """The target's config re-labelled as MiMo (Qwen2 family) with its MTP layer count."""
    config = dict(target_config)
    for key in ("_model_name_or_path", "mlp_bias", "pretraining_tp", "attention_bias"):
        config.pop(key, None)
    config.update(mtp_config)
    config.update({
        # transformers has no "mimo" type without remote code; vLLM picks the class from
        # `architectures`, and Qwen2Config reads every field MiMo needs.
        "model_type": "qwen2",
        "architectures": ["MiMoForCausalLM"],
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": config["num_hidden_layers"],
        "tie_word_embeddings": True,
    })
    return config


def _build_mtp(target_dir: Path, out_dir: Path, assets_dir=None) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    _, config_path = shipped_files("mtp", assets_dir)
    target_config = json.loads((target_dir / "config.json").read_text())
    tensors = load_file(str(target_dir / "model.safetensors"))
    dtype = tensors["model.embed_tokens.weight"].dtype
    # Qwen2 attention has q/k/v biases; a Llama checkpoint is one with all of them zero.
    for i in range(target_config["num_hidden_layers"]):
        for proj in ("q_proj", "k_proj", "v_proj"):
            rows = tensors[f"model.layers.{i}.self_attn.{proj}.weight"].shape[0]
            tensors[f"model.layers.{i}.self_attn.{proj}.bias"] = torch.zeros(rows, dtype=dtype)
    # The MTP model owns an lm_head parameter and vLLM insists every parameter is loaded;
    # the target ties it to the embedding, so store a copy.
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    for name, tensor in load_shipped_tensors("mtp", assets_dir).items():
        tensors[name] = tensor.to(dtype)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = mimo_config(target_config, json.loads(config_path.read_text()))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    _copy_tokenizer(target_dir, out_dir)


def drafter_checkpoint(kind: str, cache_dir: str | Path | None = None,
                       assets_dir: str | Path | None = None) -> Path:
    """A complete, vLLM-loadable checkpoint directory for ``kind`` (built once, then cached).

    For "mtp" the directory is a whole MiMo model: pass it as the target ``model`` too.
    ``assets_dir``: drafters laid out as the shipped assets are, somewhere else (give them their
    own ``cache_dir`` too, or they replace the shipped ones' checkpoint in the cache).
    """
    _check_kind(kind)
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    out = root / CACHE_SUBDIR / kind
    weights, config = shipped_files(kind, assets_dir)
    marker = f"{CHECKPOINT_BUILD_VERSION}-{sha256_of(weights)[:32]}-{sha256_of(config)[:32]}"
    if read_marker(out) == marker:
        return out
    target_dir = fetch_smollm2()
    if kind == "mtp":
        build_atomically(out, marker, lambda tmp: _build_mtp(target_dir, tmp, assets_dir))
    else:
        build_atomically(out, marker, lambda tmp: _build_plain(kind, target_dir, tmp, assets_dir))
    return out


def speculative_config(kind: str, num_speculative_tokens: int = 3, cache_dir=None,
                       assets_dir=None) -> dict:
    """vLLM ``speculative_config`` for ``kind`` (pair it with ``target_for(kind)``)."""
    _check_kind(kind)
    if kind == "mtp":
        # The draft is read from the target checkpoint itself (MiMo carries its MTP layer).
        return {"method": "mtp", "num_speculative_tokens": num_speculative_tokens}
    return {"method": kind, "model": str(drafter_checkpoint(kind, cache_dir, assets_dir)),
            "num_speculative_tokens": num_speculative_tokens}


def target_for(kind: str, cache_dir=None, assets_dir=None) -> Path:
    """The target checkpoint to serve with ``kind``: SmolLM2, or its MiMo build for "mtp"."""
    _check_kind(kind)
    return drafter_checkpoint("mtp", cache_dir, assets_dir) if kind == "mtp" else fetch_smollm2()
