"""Tiny random-weight Hugging Face checkpoints, one per architecture family, for fast tests.

Each has 2 layers, hidden size 64 and a ~1000-token byte-level BPE tokenizer trained on a few
Python standard library files, so transformers and vLLM both load it like a real model. The
weights are drawn with a std large enough that greedy decoding wanders over many tokens instead
of repeating one, and every parameter (biases, norm gains, Qwen3's q/k norms) is random, so a
kernel that skips one of them gives different tokens.

Everything is a pure function of ``seed`` (and of the stdlib text of the running Python).
"""
from __future__ import annotations

import json
import sysconfig
from pathlib import Path

from specdec_plugin.models.cache import build_atomically, cache_root, read_marker

TOKENIZER_VOCAB_SIZE = 1000
BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, UNK_TOKEN = "<s>", "</s>", "<pad>", "<|endoftext|>"
# ids 0..3 in this order. UNK is never produced by a byte-level BPE, but transformers' Qwen2
# tokenizer (chosen by AutoTokenizer for model_type qwen2/qwen3) appends "<|endoftext|>" when the
# vocab lacks it, which would make the tokenizer one longer than the model's vocab.
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, UNK_TOKEN)
# Small, stable stdlib modules: the tokenizer corpus (about 200 KB of Python and docstrings).
CORPUS_MODULES = ("textwrap.py", "heapq.py", "bisect.py", "string.py", "functools.py",
                  "abc.py", "fnmatch.py", "shlex.py", "colorsys.py", "keyword.py",
                  "contextlib.py", "queue.py")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

WEIGHT_STD = 0.2   # with std 0.02 (the usual init) greedy decoding repeats a single token
GAIN_JITTER = 0.2  # norm gains are 1 + this * N(0, 1)

_COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=512)
# arch -> (HF model_type, config fields beyond _COMMON)
TINY_ARCHS: dict[str, tuple[str, dict]] = {
    "llama": ("llama", dict(num_key_value_heads=2, head_dim=16, intermediate_size=128,
                            tie_word_embeddings=False)),
    # Qwen2 always has q/k/v biases; head_dim is implied as hidden / heads = 16.
    "qwen2": ("qwen2", dict(num_key_value_heads=2, intermediate_size=128,
                            tie_word_embeddings=False)),
    # head_dim 32 != hidden / heads: catches code that derives head_dim from hidden size.
    # Untied: with tied random embeddings this one falls into repeating a token after a few steps.
    "qwen3": ("qwen3", dict(num_key_value_heads=2, head_dim=32, intermediate_size=128,
                            tie_word_embeddings=False)),
    # OPT: multi-head attention (no GQA), learned positions, LayerNorm with biases, tied LM head
    # (the tied case of the Llama family is covered by the real SmolLM2).
    "opt": ("opt", dict(ffn_dim=128, word_embed_proj_dim=64, do_layer_norm_before=True,
                        tie_word_embeddings=True)),
}
ROPE_THETA = 10000.0


def tiny_archs() -> tuple[str, ...]:
    return tuple(TINY_ARCHS)


def _corpus_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [stdlib / name for name in CORPUS_MODULES if (stdlib / name).is_file()]
    if not files:
        raise FileNotFoundError(f"none of {CORPUS_MODULES} found under {stdlib}")
    return files


def train_tokenizer(out_dir: Path):
    """Train the byte-level BPE, save it into ``out_dir`` and return it (a fast tokenizer)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    # AutoTokenizer rebuilds qwen2/qwen3 tokenizers with this split and NFC; using the same
    # pipeline for every arch makes all four tokenize identically whichever class loads them.
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [path.read_text(encoding="utf-8") for path in _corpus_files()]
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=BOS_TOKEN, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=_COMMON["max_position_embeddings"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    _put_chat_template_in_tokenizer_config(out_dir)
    return tokenizer


def _put_chat_template_in_tokenizer_config(out_dir: Path) -> None:
    # transformers 5 saves the template as chat_template.jinja; older readers look here.
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _make_config(arch: str, tokenizer):
    from transformers import AutoConfig

    model_type, fields = TINY_ARCHS[arch]
    kwargs = dict(_COMMON, **fields)
    if model_type != "opt":
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": ROPE_THETA}
    return AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
        **kwargs,
    )


def randomize_parameters(model, seed: int) -> None:
    """Draw every parameter anew: matrices and biases N(0, std), norm gains around 1."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            is_gain = param.dim() == 1 and ("norm" in name) and name.endswith("weight")
            value = 1.0 + GAIN_JITTER * noise if is_gain else WEIGHT_STD * noise
            param.copy_(value.to(param.dtype))


def _patch_config(out_dir: Path, arch: str) -> None:
    # Top-level keys for readers that predate transformers 5's rope_parameters / dtype.
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["torch_dtype"] = "float32"
    if TINY_ARCHS[arch][0] != "opt":
        config["rope_theta"] = ROPE_THETA
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def build_tiny_checkpoint(arch: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny random ``arch`` checkpoint (float32 safetensors + tokenizer) to ``out_dir``."""
    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny arch {arch!r}; known: {', '.join(TINY_ARCHS)}")
    import torch
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(out_dir)
    config = _make_config(arch, tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize_parameters(model, seed)
    model.save_pretrained(out_dir)
    _patch_config(out_dir, arch)
    return out_dir


def tiny_checkpoint(arch: str, seed: int = 0) -> Path:
    """Cached tiny checkpoint under ``$SPECDEC_CACHE_DIR/tiny/<arch>``, built on first use."""
    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny arch {arch!r}; known: {', '.join(TINY_ARCHS)}")
    target = cache_root() / "tiny" / (arch if seed == 0 else f"{arch}-seed{seed}")
    marker = f"tiny {arch} seed={seed}"
    if read_marker(target) == marker:
        return target
    return build_atomically(target, marker,
                            lambda tmp: build_tiny_checkpoint(arch, tmp, seed=seed))
