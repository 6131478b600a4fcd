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
    """The first ``max_tokens`` greedy tokens after the prompt, going on past EOS like vLLM's
    ``ignore_eos=True``. A plain argmax loop: ``generate(min_new_tokens=...)`` would instead
    forbid EOS, which changes the output."""
    import torch

    _, model = _load(model_path)
    ids = torch.tensor([prompt_token_ids])
    out: list[int] = []
    past = None
    with torch.no_grad():
        for _ in range(max_tokens):
            result = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = result.past_key_values
            token = int(result.logits[0, -1].argmax())
            out.append(token)
            ids = torch.tensor([[token]])
    return out


def tokenize(model_path: str, text: str) -> list[int]:
    tokenizer, _ = _load(model_path)
    return tokenizer(text).input_ids
