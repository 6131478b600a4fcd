"""Pack the shipped drafter weights as row-wise int8, in place (one-off; idempotent).

    python training/pack_int8.py [ASSETS_DIR]

Every 2-D floating tensor with at least ``MIN_PACKED_ELEMENTS`` elements (every matrix of the four
drafters: embeddings, lm_head, fc, attention and MLP projections) becomes ``<name>.qweight``
(int8, same shape) + ``<name>.scale`` (fp16, one per row): symmetric, scale = absmax(row)/127.
Norms, biases and the EAGLE-3 d2t/t2d maps stay exactly as they were. The file keeps its name
and metadata and gains ``specdec_format`` in the metadata; ``specdec_plugin.models.drafters``
dequantizes to bf16 when it writes the vLLM checkpoint (format described there).

Run it after ``unpack_device_output.py`` writes fresh bf16 assets; files already packed are
skipped. It prints, per packed matrix, the worst per-row error relative to that row's absmax and
the relative Frobenius error, so a bad row cannot hide behind a good average.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec_plugin.models.drafters import (
    ASSETS_DIR, KINDS, PACKED_FORMAT, QWEIGHT_SUFFIX, SCALE_SUFFIX, dequantize_rowwise,
    shipped_files)

MIN_PACKED_ELEMENTS = 16_384
# Below fp16's smallest normal number a scale loses mantissa bits; no trained row is that small.
FP16_MIN_NORMAL = 6.104e-5


def quantize_rowwise(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [rows, cols], fp16 scale [rows]) with weight ~= qweight * scale[:, None]."""
    rows = weight.float()
    scale = (rows.abs().amax(dim=1) / 127.0).to(torch.float16)
    # Quantize against the scale as stored, so dequantization sees the same number.
    divisor = scale.float().clamp_min(torch.finfo(torch.float32).tiny)[:, None]
    qweight = torch.round(rows / divisor).clamp_(-127, 127).to(torch.int8)
    return qweight, scale


def should_pack(tensor: torch.Tensor) -> bool:
    return (tensor.dim() == 2 and tensor.is_floating_point()
            and tensor.numel() >= MIN_PACKED_ELEMENTS)


def quantization_errors(weight: torch.Tensor, restored: torch.Tensor) -> tuple[float, float]:
    """(max over rows of max|err|/absmax(row), ||err||_F / ||w||_F)."""
    weight, err = weight.float(), restored.float() - weight.float()
    row_absmax = weight.abs().amax(dim=1).clamp_min(1e-30)
    worst_row = (err.abs().amax(dim=1) / row_absmax).max().item()
    return worst_row, (err.norm() / weight.norm().clamp_min(1e-30)).item()


def pack_file(path: Path) -> None:
    with safe_open(str(path), "pt") as handle:
        metadata = dict(handle.metadata() or {})
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    if metadata.get("specdec_format") == PACKED_FORMAT:
        print(f"{path}: already packed, skipped")
        return
    before = path.stat().st_size
    packed = {}
    for name, tensor in tensors.items():
        if not should_pack(tensor):
            packed[name] = tensor
            continue
        qweight, scale = quantize_rowwise(tensor)
        nonzero = scale[scale != 0]
        assert nonzero.numel() == 0 or nonzero.float().min().item() >= FP16_MIN_NORMAL, name
        restored = dequantize_rowwise(qweight, scale, tensor.dtype)
        worst_row, frobenius = quantization_errors(tensor, restored)
        print(f"  {name:48s} {str(tuple(tensor.shape)):14s} max row-relative error "
              f"{worst_row:.5f}  relative Frobenius error {frobenius:.5f}")
        packed[name + QWEIGHT_SUFFIX] = qweight
        packed[name + SCALE_SUFFIX] = scale
    metadata["specdec_format"] = PACKED_FORMAT
    tmp = path.with_suffix(".tmp")
    save_file(packed, str(tmp), metadata=metadata)
    tmp.chmod(path.stat().st_mode & 0o777)  # safetensors writes 0600; keep the asset readable
    tmp.replace(path)
    print(f"{path}: {before} -> {path.stat().st_size} bytes")


def main(assets: Path) -> None:
    for kind in KINDS:
        weights, _ = shipped_files(kind)
        weights = assets / kind / weights.name
        print(f"{kind}:")
        pack_file(weights)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ASSETS_DIR)
