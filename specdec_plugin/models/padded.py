"""SmolLM2-135M-Instruct padded to a 7B-class shape, with its trained drafters padded to match.

For GPU benchmarks: every GEMM reads full-size weights while the model still computes
SmolLM2's exact function, so the shipped drafters keep their real acceptance rates. How a
checkpoint is padded, and why each block is zero or random: padded_llama.py (targets and the
draft model) and padded_drafters.py (EAGLE-1 / EAGLE-3 heads).

``PADDED_7B`` (width 4x, so the RMSNorm gain factor sqrt(d/D) = 1/2 is exact in bf16):

- target: hidden 576 -> 2304, heads 9/3 -> 36/12 (head_dim 64), MLP 1536 -> 14336, layers
  30 -> 60 (30 appended zero-output layers), vocab 49152, tied embeddings:
  6,908,297,472 parameters (13.8 GB in bf16);
- draft_model (the shipped draft: 4 of SmolLM2's own layers at its width, session 35): padded
  exactly as the target's layers are (hidden 2304, heads 36/12, MLP 14336), 4 layers, so it
  stays 4 of the padded target's layers: 566,251,776 parameters, 8.2% of the target. Its vocab
  and tied embedding are the target's (the shipped file leaves the embedding out; it is read
  from SmolLM2's checkpoint, ``drafters.draft_model_tensors``);
- eagle / eagle3 heads: hidden 2304 (they read the target's hidden states), heads 36/12, MLP
  14336 (a 7B target's layer, as real EAGLE heads for 7-8B targets have), one layer each;
  EAGLE-3's aux layers stay 2/15/27, set explicitly in its config. EAGLE-1: 123,865,344
  parameters; EAGLE-3: 175,629,312 (with its 16320-token LM head; 152,183,808 with the 6144-token
  head shipped until session 17).
- mtp is not built: vLLM runs MTP only with a target whose architecture carries the layer
  (MiMo, a Qwen2 with q/k/v biases), which means a second 14 GB target of another architecture.

``PADDED_TEST``: the same widths with MLPs 2048 and 2 appended target layers, about 1.0B target
parameters: a quick end-to-end check of loading in vLLM.

``build_padded_checkpoints(out_dir, small_target_dir, shape=PADDED_7B, kinds=...)`` writes
``out_dir/<kind>`` for kind in "target", "draft_model", "eagle", "eagle3" (bf16 safetensors,
target in shards of at most 5 GB with an index, tokenizer files copied, config.json) and
returns {kind: path}. Each directory is built atomically and reused when its inputs match.
``padded_speculative_config(kind, drafter_dir, k)`` is the dict to hand vLLM with the padded
target as ``model``. CLI::

    python -m specdec_plugin.models.padded --small-target DIR --out DIR [--shape 7b|test]
        [--kinds target,draft_model,eagle,eagle3] [--device cuda] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from specdec_plugin.models.cache import build_atomically, read_marker
from specdec_plugin.models.smollm2 import sha256_of
from specdec_plugin.models.drafters import (
    TOKENIZER_FILES,
    draft_model_tensors,
    load_shipped_tensors,
    shipped_files,
)
from specdec_plugin.models.padded_drafters import pad_eagle3_state_dict, pad_eagle_state_dict
from specdec_plugin.models.padded_llama import (
    PaddedShape,
    iter_padded_llama,
    llama_param_count,
    padded_config,
)

KINDS = ("target", "draft_model", "eagle", "eagle3")
DRAFTER_METHODS = {"draft_model": "draft_model", "eagle": "eagle", "eagle3": "eagle3"}
MAX_SHARD_BYTES = 5 * 10**9
BUILD_VERSION = "padded-v2"  # v2: the draft model is read with the target's embedding


@dataclass(frozen=True)
class PaddedShapes:
    """A padded target and the shapes its drafters are padded to."""

    target: PaddedShape
    draft_model: PaddedShape
    head_intermediate_size: int  # MLP width of the padded EAGLE / EAGLE-3 heads

    def head(self, layers: int = 1) -> PaddedShape:
        t = self.target
        return PaddedShape(t.hidden_size, t.num_attention_heads, t.num_key_value_heads,
                           self.head_intermediate_size, layers)


PADDED_7B = PaddedShapes(target=PaddedShape(2304, 36, 12, 14336, 60),
                         draft_model=PaddedShape(2304, 36, 12, 14336, 4),
                         head_intermediate_size=14336)
PADDED_TEST = PaddedShapes(target=PaddedShape(2304, 36, 12, 2048, 32),
                           draft_model=PaddedShape(2304, 36, 12, 2048, 4),
                           head_intermediate_size=2048)
SHAPES = {"7b": PADDED_7B, "test": PADDED_TEST}


def _log(message: str) -> None:
    print(f"[specdec-padded] {message}", file=sys.stderr, flush=True)


def _read_checkpoint(folder: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    if not tensors:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    return tensors, json.loads((folder / "config.json").read_text())


def _write_config(folder: Path, config: dict) -> None:
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _copy_tokenizer(source: Path, folder: Path) -> None:
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copyfile(source / name, folder / name)


def write_sharded(named_tensors, folder: Path, max_shard_bytes: int = MAX_SHARD_BYTES) -> int:
    """Save (name, tensor) pairs as it gets them into shards of at most ``max_shard_bytes``
    (one tensor may exceed it alone) plus ``model.safetensors.index.json``; returns bytes."""
    from safetensors.torch import save_file

    shards: list[list[str]] = []
    weight_map: dict[str, int] = {}
    pending: dict = {}
    pending_bytes = total = 0

    def flush() -> None:
        nonlocal pending, pending_bytes
        if pending:
            save_file(pending, str(folder / f".shard-{len(shards)}"), metadata={"format": "pt"})
            shards.append(list(pending))
            pending, pending_bytes = {}, 0

    for name, tensor in named_tensors:
        size = tensor.numel() * tensor.element_size()
        if pending and pending_bytes + size > max_shard_bytes:
            flush()
        pending[name] = tensor.detach().to("cpu").contiguous()
        weight_map[name] = len(shards)
        pending_bytes += size
        total += size
    flush()
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for index, name in enumerate(names):
        (folder / f".shard-{index}").rename(folder / name)
    index = {"metadata": {"total_size": total},
             "weight_map": {tensor: names[shard] for tensor, shard in sorted(weight_map.items())}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return total


def _marker(kind: str, shape, seed: int, sources: list[Path]) -> str:
    digests = ",".join(sha256_of(p)[:24] for p in sorted(sources))
    return f"{BUILD_VERSION} {kind} {json.dumps(asdict(shape), sort_keys=True)} seed={seed} " \
           f"src={digests}"


def _build_target(small_dir: Path, folder: Path, shape: PaddedShape, seed: int, dtype,
                  device, max_shard_bytes: int) -> None:
    tensors, config = _read_checkpoint(small_dir)
    padded = padded_config(config, shape, str(dtype).removeprefix("torch."))
    _log(f"target: {llama_param_count(padded):,} parameters -> {folder}")
    write_sharded(iter_padded_llama(tensors, config, shape, seed, dtype=dtype, device=device),
                  folder, max_shard_bytes)
    _write_config(folder, padded)
    _copy_tokenizer(small_dir, folder)


def _build_draft_model(small_dir: Path, folder: Path, shape: PaddedShape, seed: int, dtype,
                       device) -> None:
    config = json.loads(shipped_files("draft_model")[1].read_text())
    padded = padded_config(config, shape, str(dtype).removeprefix("torch."))
    _log(f"draft_model: {llama_param_count(padded):,} parameters -> {folder}")
    tensors = iter_padded_llama(draft_model_tensors(small_dir), config, shape, seed,
                                dtype=dtype, device=device)
    write_sharded(tensors, folder)
    _write_config(folder, padded)
    _copy_tokenizer(small_dir, folder)


def _build_head(kind: str, folder: Path, shapes: PaddedShapes, seed: int, dtype,
                device) -> None:
    from safetensors.torch import save_file

    config = json.loads(shipped_files(kind)[1].read_text())
    shape = shapes.head(config["num_hidden_layers"])
    pad = pad_eagle_state_dict if kind == "eagle" else pad_eagle3_state_dict
    tensors, padded = pad(load_shipped_tensors(kind), config, shape, seed, dtype=dtype,
                          device=device)
    _log(f"{kind}: {sum(t.numel() for t in tensors.values()):,} parameters -> {folder}")
    # vLLM's EAGLE loaders read every *.safetensors in the folder; one file, like the shipped.
    save_file({name: t.to("cpu").contiguous() for name, t in tensors.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    _write_config(folder, padded)


def build_padded_checkpoints(out_dir, small_target_dir, shape: PaddedShapes = PADDED_7B,
                             kinds=KINDS, seed: int = 0, device: str = "cpu", dtype=None,
                             max_shard_bytes: int = MAX_SHARD_BYTES) -> dict[str, Path]:
    """Write ``out_dir/<kind>`` for each of ``kinds`` (see module doc); {kind: directory}.

    ``small_target_dir`` is SmolLM2's checkpoint (``fetch_smollm2()``) for the drafters, or any
    Llama checkpoint when ``kinds`` is ("target",). Random fills are made on ``device``.
    A directory whose marker matches (same shape, seed, inputs) is kept as it is.
    """
    import torch

    dtype = dtype or torch.bfloat16
    out_dir, small_dir = Path(out_dir), Path(small_target_dir)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown kinds {sorted(unknown)}; expected some of {KINDS}")
    small_weights = sorted(small_dir.glob("*.safetensors")) + [small_dir / "config.json"]
    jobs = {
        "target": (shape.target, small_weights,
                   lambda f: _build_target(small_dir, f, shape.target, seed, dtype, device,
                                           max_shard_bytes)),
        "draft_model": (shape.draft_model, list(shipped_files("draft_model")),
                        lambda f: _build_draft_model(small_dir, f, shape.draft_model, seed,
                                                     dtype, device)),
        "eagle": (shape.head(), list(shipped_files("eagle")),
                  lambda f: _build_head("eagle", f, shape, seed, dtype, device)),
        "eagle3": (shape.head(), list(shipped_files("eagle3")),
                   lambda f: _build_head("eagle3", f, shape, seed, dtype, device)),
    }
    built = {}
    for kind in kinds:
        kind_shape, sources, build = jobs[kind]
        folder = out_dir / kind
        marker = _marker(kind, kind_shape, seed, sources) + f" dtype={dtype}"
        if read_marker(folder) != marker:
            build_atomically(folder, marker, build)
        else:
            _log(f"{kind}: up to date at {folder}")
        built[kind] = folder
    return built


def padded_speculative_config(kind: str, drafter_dir, num_speculative_tokens: int = 3) -> dict:
    """vLLM ``speculative_config`` for a padded drafter (serve it with the padded target)."""
    if kind not in DRAFTER_METHODS:
        raise ValueError(f"no padded drafter {kind!r}; expected one of {tuple(DRAFTER_METHODS)}")
    return {"method": DRAFTER_METHODS[kind], "model": str(drafter_dir),
            "num_speculative_tokens": num_speculative_tokens}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec_plugin.models.padded",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--small-target", required=True, type=Path,
                        help="SmolLM2 checkpoint directory (specdec-models fetch smollm2-135m)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--device", default="cpu", help="where random fills are made")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    built = build_padded_checkpoints(args.out, args.small_target, SHAPES[args.shape], kinds,
                                     seed=args.seed, device=args.device)
    print(json.dumps({kind: str(path) for kind, path in built.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
