"""Would SmolLM2 with some of its own layers, untrained, make a draft model worth shipping?

Issue 17's draft model (1.45 on the GPU set against a bar of 2.2) is the drafter furthest from
its bar. A draft model built at load time from the target's own checkpoint (a subset of its 30
layers, its norm and LM head) would ship no weights at all. This measures, on the CPU, what such
drafts would reach untrained: the target's greedy answers to the held-out prompts
(``heldout_eval_prompts.json``), then for each layer subset its argmax at every position of those
answers. Acceptance length at K=4 is counted teacher-forced, which is exact for greedy chains: a
draft token is only ever drafted from a prefix that is still right.

    python -m training.layer_subset_drafts --per-category 24 --out OUT.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

PROMPTS = Path(__file__).with_name("heldout_eval_prompts.json")
SUBSETS = {
    "all 30 (check: 5 at K=4)": range(30),
    "first 6": range(6), "first 10": range(10), "first 15": range(15),
    "first 20": range(20), "first 25": range(25),
    "0-7 + 26-29": [*range(8), *range(26, 30)],
}


def greedy_answers(model, prompts: dict, per_category: int, new_tokens: int):
    """(category, prompt length, prompt + answer ids) per prompt; batches left-padded."""
    seqs = []
    for category in ("chat", "code", "prose"):
        batch = [p["prompt_token_ids"] for p in prompts[category][:per_category]]
        width = max(map(len, batch))
        ids = torch.tensor([[2] * (width - len(b)) + b for b in batch])
        mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch])
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False)
        seqs += [(category, len(b), torch.tensor(b + o[width:].tolist())) for b, o in zip(batch, out)]
    return seqs


def acceptance_length(match: list[bool], start: int, end: int, k: int) -> float:
    """Tokens per verification step when greedy drafts of k tokens are checked from ``start``."""
    pos, steps = start, 0
    while pos < end:
        m = 0
        while m < k and pos + m < end and match[pos + m]:
            m += 1
        steps += 1
        pos += m + 1
    return (end - start) / steps


def measure_subset(model, layers, keep, seqs, k: int) -> dict:
    model.model.layers = torch.nn.ModuleList([layers[i] for i in keep])
    per_category: dict[str, list[tuple[float, float]]] = {}
    try:
        for category, start, seq in seqs:
            pred = model(seq[None], use_cache=False).logits[0].argmax(-1)
            match = [False] + (pred[:-1] == seq[1:]).tolist()
            per_category.setdefault(category, []).append(
                (acceptance_length(match, start, len(seq), k), sum(match[start:]) / (len(seq) - start)))
    finally:
        model.model.layers = layers
    return {c: {"acceptance_length": round(sum(a for a, _ in v) / len(v), 3),
                "depth1_agreement": round(sum(d for _, d in v) / len(v), 3)}
            for c, v in per_category.items()}


def main() -> None:
    from transformers import AutoModelForCausalLM

    from specdec_plugin.models import fetch_smollm2

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--per-category", type=int, default=24)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    model = AutoModelForCausalLM.from_pretrained(str(fetch_smollm2()), dtype=torch.float32).eval()
    started = time.perf_counter()
    with torch.inference_mode():
        seqs = greedy_answers(model, json.loads(PROMPTS.read_text()), args.per_category, args.new_tokens)
        layers = model.model.layers
        results = {}
        for name, keep in SUBSETS.items():
            results[name] = measure_subset(model, layers, list(keep), seqs, args.k)
            print(f"{name:28s} {results[name]}", flush=True)
    Path(args.out).write_text(json.dumps({
        "what": "untrained SmolLM2 layer subsets as draft models, teacher-forced greedy chains",
        "k": args.k, "per_category": args.per_category, "new_tokens": args.new_tokens,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": round(time.perf_counter() - started), "subsets": results}, indent=1))


if __name__ == "__main__":
    main()
