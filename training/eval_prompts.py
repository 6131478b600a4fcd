"""The fixed held-out prompt set for acceptance evaluation (``heldout_eval_prompts.json``).

Built once, here, from held-out prompts only (``prompt_sources.is_heldout``: never generated
for training on any machine, since the rule reads names, not content) and stored rendered
(chat template applied), so the CPU and GPU evaluations run exactly the same token streams:

    python -m training.eval_prompts            # rewrites training/heldout_eval_prompts.json

Per category ``PER_CATEGORY`` prompts; chat starts with the GPU test questions
(tests/prompts_gpu.py), which are always held out.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from training.prompt_sources import (CATEGORIES, _gpu_test_questions, build_all, is_heldout,
                                     stable_hash)

PATH = Path(__file__).resolve().parent / "heldout_eval_prompts.json"
PER_CATEGORY = 24
MAX_PROMPT_TOKENS = 512


def build(tokenizer, per_category: int = PER_CATEGORY, max_files: int = 3000) -> dict:
    from training.stage_gen import render

    first = sorted(_gpu_test_questions())
    prompts = [{"name": f"chat/{q}", "category": "chat", "chat": True, "text": q} for q in first]
    prompts += [p for p in build_all(max_files, workers=1, budget_s=120)
                if is_heldout(p["name"]) and p["text"] not in first]
    # GPU test questions first, then a hash order (no alphabetical bias towards a few packages).
    prompts.sort(key=lambda p: (p["text"] not in first, stable_hash(p["name"])))
    rendered = render(prompts, tokenizer, MAX_PROMPT_TOKENS)
    out = {}
    for cat in CATEGORIES:
        items = [p for p in rendered if p["category"] == cat][:per_category]
        out[cat] = [{"name": p["name"], "prompt_token_ids": p["ids"]} for p in items]
    return out


def analysis_parser(description: str, categories: str):
    """The options every CPU analysis of an EAGLE-3 head on this set takes
    (depth1_by_confidence.py, walk_on_eval.py)."""
    import argparse

    from specdec_plugin.models.drafters import ASSETS_DIR

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--drafters", type=Path, default=ASSETS_DIR, help="an assets tree or run")
    p.add_argument("--prompts", type=Path, default=PATH)
    p.add_argument("--categories", default=categories)
    p.add_argument("--per-category", type=int, default=PER_CATEGORY)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--out", type=Path)
    return p


def target_and_eagle3(drafters: Path):
    """SmolLM2 (transformers, fp32, eval mode) and the EAGLE-3 head under ``drafters``."""
    import torch
    from transformers import AutoModelForCausalLM

    from specdec_plugin.models.smollm2 import fetch_smollm2
    from training.drafter_io import load_for_resume

    model = AutoModelForCausalLM.from_pretrained(str(fetch_smollm2()), dtype=torch.float32)
    head = load_for_resume(drafters, "eagle3", None, log=lambda message: None)
    return model.eval(), head.eval()


def load(path: Path = PATH) -> dict:
    return json.loads(Path(path).read_text())


def chat_questions(path: Path = PATH) -> list[str]:
    """The evaluation's chat questions as text (its names are ``chat/<question>``)."""
    return [p["name"].removeprefix("chat/") for p in load(path)["chat"]]


def main() -> int:
    from transformers import AutoTokenizer

    from specdec_plugin.models import fetch_smollm2

    tokenizer = AutoTokenizer.from_pretrained(str(fetch_smollm2()))
    prompts = build(tokenizer)
    PATH.write_text(json.dumps(prompts, indent=0) + "\n")
    print({c: len(v) for c, v in prompts.items()}, PATH, PATH.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
