"""Greedy generation with Hugging Face transformers: the ground truth for our outputs."""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=4)
def _load(model_path: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.eval()
    return tokenizer, model


def hf_greedy_token_ids(model_path: str, prompt_token_ids: list[int], max_tokens: int) -> list[int]:
    """The first ``max_tokens`` greedy tokens after the prompt, ignoring EOS like vLLM's
    ``ignore_eos=True``."""
    import torch

    _, model = _load(model_path)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_token_ids]), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
            do_sample=False, num_beams=1, pad_token_id=0,
        )
    return out[0, len(prompt_token_ids):].tolist()


def tokenize(model_path: str, text: str) -> list[int]:
    tokenizer, _ = _load(model_path)
    return tokenizer(text).input_ids
