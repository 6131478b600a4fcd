"""Checkpoint directories for the GPU benchmark, built on the device (configs only: weights come
from vLLM's ``load_format="dummy"``, uniform random values, the same in both backends).

- ``llama-7b-random``: a 7.24B Llama (32 layers, hidden 4096, MLP 14336, 32/8 heads, vocab
  32,000), the shape of ../shared/notes/native-baseline.md.
- its drafters: a 2-layer 96M Llama (``draft_model``), an EAGLE-1 head (fc 2d->d + one decoder
  layer) and an EAGLE-3 head (fc over 3 target layers + one decoder layer, full vocabulary, so
  the zero-initialised draft-to-target map is the identity).

Random weights make acceptance meaningless, so these runs use vLLM's synthetic rejection
sampling: each draft is accepted with a fixed probability calibrated to a target acceptance
length. That measures the cost of the machinery (drafting, verification, sampling, graphs)
independently of drafter quality.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

LLAMA_7B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
}


def _family(target: dict, draft_model: dict, aux_layers: list[int]) -> dict[str, dict]:
    """A target and its drafters: a draft model (``draft_model``'s keys over the target's), and
    one-layer EAGLE and EAGLE-3 heads of the target's width and full vocabulary (so the
    zero-initialised draft-to-target map is the identity), EAGLE-3 over ``aux_layers``."""
    return {
        "target": target,
        "draft_model": {**target, **draft_model},
        "eagle": {**target, "num_hidden_layers": 1},
        "eagle3": {**target, "num_hidden_layers": 1, "draft_vocab_size": target["vocab_size"],
                   "target_hidden_size": target["hidden_size"], "norm_before_residual": False,
                   "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_layers,
                                    "use_aux_hidden_state": True}},
    }


# Draft model: hidden 1024, 8 heads of 128, 2 layers, MLP 3584, untied 32K embeddings: 96M
# parameters.
CONFIGS = _family(LLAMA_7B, {"hidden_size": 1024, "intermediate_size": 3584,
                             "num_hidden_layers": 2, "num_attention_heads": 8,
                             "num_key_value_heads": 8}, [2, 16, 29])

# For tensor parallel runs (issue 14): Llama-3.1-70B's layer shapes (hidden 8192, MLP 28672,
# 64/8 heads of 128, vocab 128,256) with 40 of its 80 layers: 36.3B parameters, 73 GB in bf16,
# so TP=2 holds it on two H200s. Drafters in proportion: a 2-layer 2048-wide draft model
# (16/8 heads, which split over 2 GPUs) and one-layer EAGLE / EAGLE-3 heads of the target's width.
LLAMA_70B_40L = {**LLAMA_7B, "hidden_size": 8192, "intermediate_size": 28672,
                 "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": 8,
                 "vocab_size": 128256, "max_position_embeddings": 8192}
CONFIGS_70B_40L = _family(LLAMA_70B_40L, {"hidden_size": 2048, "intermediate_size": 7168,
                                          "num_hidden_layers": 2, "num_attention_heads": 16,
                                          "num_key_value_heads": 8}, [2, 20, 37])

# For host-time runs on the CPU (bench_host_step_cpu.py): a 4-layer Llama of width 128, so a
# step's model forwards are small next to its host work, and drafters in proportion.
TINY_4L = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 2048,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "float32",
}
CONFIGS_TINY_4L = _family(TINY_4L, {"hidden_size": 64, "intermediate_size": 128,
                                    "num_hidden_layers": 2, "num_attention_heads": 2,
                                    "num_key_value_heads": 2}, [1, 2, 3])

# Model family name -> its checkpoint configs (the family names the directories).
FAMILIES = {"llama7b": CONFIGS, "llama70b-40l": CONFIGS_70B_40L, "tiny-4l": CONFIGS_TINY_4L}


def synthetic_spec_configs(paths: dict[str, str], acceptance_length: float,
                           k: int) -> dict[str, dict | None]:
    """Method -> speculative_config over ``write_configs``'s drafters, with vLLM's synthetic
    acceptance at ``acceptance_length`` and K = ``k``; "none" -> None."""
    synthetic = {"rejection_sample_method": "synthetic",
                 "synthetic_acceptance_length": acceptance_length, "num_speculative_tokens": k}
    return {
        "none": None,
        "draft_model": {"method": "draft_model", "model": paths["draft_model"], **synthetic},
        "eagle": {"method": "eagle", "model": paths["eagle"], **synthetic},
        "eagle3": {"method": "eagle3", "model": paths["eagle3"], **synthetic},
        "ngram": {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 4, **synthetic},
        "suffix": {"method": "suffix", **synthetic},
    }


def write_configs(root: str | Path, family: str = "llama7b") -> dict[str, str]:
    """One directory per entry of the family's configs, holding its config.json; returns
    name -> path."""
    root = Path(root)
    paths = {}
    for name, config in FAMILIES[family].items():
        directory = root / f"{family}-{name}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(config, indent=1))
        paths[name] = str(directory)
    return paths


def tiny_cpu_engine(target: str, speculative_config: dict | None, max_num_seqs: int):
    """An engine of the "tiny-4l" target with dummy weights on the CPU, whose steps are mostly
    host work (bench_host_step_cpu.py, trace_probes_cpu.py). In this process where
    VLLM_ENABLE_V1_MULTIPROCESSING=0, as both scripts set it."""
    from vllm import LLM

    return LLM(model=target, dtype="float32", load_format="dummy", skip_tokenizer_init=True,
               max_model_len=512, seed=0, enable_prefix_caching=False,
               max_num_seqs=max_num_seqs, kv_cache_memory_bytes=96 << 20,
               speculative_config=speculative_config)


def param_count(config: dict) -> int:
    h, m, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    q = config["num_attention_heads"] * config["head_dim"]
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * m + 2 * h
    embeddings = config["vocab_size"] * h * (1 if config["tie_word_embeddings"] else 2)
    return layers * per_layer + embeddings + h


def repeated_random_prompt(num_distinct: int = 32, repeats: int = 6, vocab: int = 32000,
                           seed: int = 0) -> list[int]:
    """192 token ids: 32 random ids repeated 6 times (as in the native baseline notes)."""
    rng = random.Random(seed)
    ids = [rng.randrange(100, vocab) for _ in range(num_distinct)]
    return ids * repeats
