"""Self-distillation data: the target generates continuations, then its hidden states are kept.

``generate_sequences`` runs batched HF ``generate`` (greedy and T=0.7 sampling, left-padded
prompts) and returns token lists cut after the first end token. ``capture_hidden`` runs the
target once more over every sequence (right-padded, causal, so padding never reaches a real
position) and keeps, on the device:
- ``pre``  [N, L, d]: the final residual stream before the last norm (what vLLM's MiMo target
  hands its MTP layer; post-norm features for EAGLE-1 are ``target_norm(pre)``);
- ``aux``  [N, L, 3d]: residual stream after layers 2, 15 and 27 (vLLM's default EAGLE-3 taps
  for a 30-layer model: ``(2, n // 2, n - 3)``, "after k layers").
"""
from __future__ import annotations

import time

import torch

END_TOKENS = (2, 0)  # <|im_end|>, <|endoftext|>
PAD_TOKEN = 2
AUX_LAYERS = (2, 15, 27)


def _cut_after_end(tokens: list[int]) -> list[int]:
    for i, tok in enumerate(tokens):
        if tok in END_TOKENS:
            return tokens[: i + 1]
    return tokens


@torch.no_grad()
def generate_sequences(model, tokenizer, prompts, n_sampled: int, max_new: int,
                       batch_size: int, max_prompt: int, device, log) -> list[dict]:
    """One greedy and ``n_sampled`` sampled continuations per prompt."""
    encoded = []
    for i, prompt in enumerate(prompts):
        ids = tokenizer(prompt["text"], add_special_tokens=False)["input_ids"]
        if len(ids) <= max_prompt:
            encoded.append((i, ids))
    jobs = [(i, ids, True) for i, ids in encoded]
    jobs += [(i, ids, False) for i, ids in encoded for _ in range(n_sampled)]
    # Similar prompt lengths per batch keep left padding short.
    jobs.sort(key=lambda job: (job[2], len(job[1])))
    out = []
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start:start + batch_size]
        groups = [[job for job in chunk if job[2] == flag] for flag in (True, False)]
        for group in groups:
            if not group:
                continue
            t0 = time.time()
            width = max(len(job[1]) for job in group)
            input_ids = torch.full((len(group), width), PAD_TOKEN, dtype=torch.long)
            mask = torch.zeros((len(group), width), dtype=torch.long)
            for row, (_, ids, _) in enumerate(group):
                input_ids[row, width - len(ids):] = torch.tensor(ids)
                mask[row, width - len(ids):] = 1
            greedy = group[0][2]
            kwargs = dict(do_sample=False) if greedy else dict(
                do_sample=True, temperature=0.7, top_k=0, top_p=1.0)
            torch.manual_seed(start)
            result = model.generate(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                                    max_new_tokens=max_new, eos_token_id=list(END_TOKENS),
                                    pad_token_id=PAD_TOKEN, **kwargs)
            result = result[:, width:].cpu().tolist()
            for (i, ids, flag), gen in zip(group, result):
                out.append({"prompt": i, "tokens": ids + _cut_after_end(gen),
                            "prompt_len": len(ids), "greedy": flag})
            log(f"generate: {len(group)} seqs ({'greedy' if greedy else 'T=0.7'}), prompt width "
                f"{width}, {time.time() - t0:.1f}s")
    return out


def target_norm(model, x):
    norm = model.model.norm
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-5))
    xf = x.float()
    return norm.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@torch.no_grad()
def capture_hidden(model, seqs, device, dtype, batch_size: int, log,
                   aux_layers=AUX_LAYERS) -> dict:
    """Tokens and target hidden states for every sequence, padded to the longest; ``aux``
    holds the residual stream after each of ``aux_layers`` (an EAGLE-3 head's taps)."""
    n = len(seqs)
    length = max(len(s["tokens"]) for s in seqs)
    d = model.config.hidden_size
    tokens = torch.full((n, length), PAD_TOKEN, dtype=torch.long, device=device)
    lengths = torch.tensor([len(s["tokens"]) for s in seqs], device=device)
    prompt_lens = torch.tensor([s["prompt_len"] for s in seqs], device=device)
    for row, s in enumerate(seqs):
        tokens[row, : len(s["tokens"])] = torch.tensor(s["tokens"], device=device)
    pre = torch.zeros((n, length, d), dtype=dtype, device=device)
    aux = torch.zeros((n, length, len(aux_layers) * d), dtype=dtype, device=device)

    layers = model.model.layers
    taps = {k - 1: j for j, k in enumerate(aux_layers)}  # "after k layers" = output of k-1
    captured = {}

    def hook_for(index):
        def hook(_module, _inputs, output):
            captured[index] = output[0] if isinstance(output, tuple) else output
        return hook

    wanted = set(taps) | {len(layers) - 1}
    handles = [layers[i].register_forward_hook(hook_for(i)) for i in wanted]
    t0 = time.time()
    order = sorted(range(n), key=lambda r: int(lengths[r]))
    try:
        for start in range(0, n, batch_size):
            rows = torch.tensor(order[start:start + batch_size], device=device)
            width = int(lengths[rows].max())
            model.model(input_ids=tokens[rows, :width], use_cache=False)
            pre[rows, :width] = captured[len(layers) - 1].to(dtype)
            for layer_index, j in taps.items():
                aux[rows, :width, j * d:(j + 1) * d] = captured[layer_index].to(dtype)
    finally:
        for handle in handles:
            handle.remove()
    log(f"capture: {n} seqs, max len {length}, {time.time() - t0:.1f}s")
    return {"tokens": tokens, "lengths": lengths, "prompt_lens": prompt_lens,
            "pre": pre, "aux": aux}
