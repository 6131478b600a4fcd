"""Three chat sets side by side, to tell a distribution shift from too little training:

- ``eval_chat``: the evaluation's chat questions (``heldout_eval_prompts.json``), free-form;
- ``templated``: held-out templated instructions (``chat_instructions.py``) of the kind the
  drafters were trained on, none of them an evaluation question;
- ``self_instruct``: held-out questions SmolLM2 wrote (``self_instruct.py``). No drafter saw
  them; the EAGLE-3 shipped since session 20 trained on the rest of that file, so for it this
  set is held-out chat of a kind it knows, no longer an unseen kind;
- ``self_instruct_trained``: questions from the same file that are not held out, which every
  EAGLE-3 since session 20 trained on (``stage_gen`` runs out of chat prompts before its
  deadline). Against ``self_instruct`` it tells whether the head learned chat or these
  questions' answers: a head that reads much better on them has too few distinct questions.

Written in the evaluation's prompt-file format, for ``eval_acceptance --prompts``:

    python -m training.chat_shift --out /tmp/chat_shift.json
    python -m training.eval_acceptance --prompts /tmp/chat_shift.json --methods eagle3 \\
        --max-tokens 64 --out /tmp/chat_shift_eagle3.json

If templated reads well above eval_chat while self_instruct reads like eval_chat, the drafters
learned the templates' answers rather than chat; training on the self-instruct questions is
then the lever (issue 17's chat bar).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from training.prompt_sources import is_heldout, stable_hash


def _chat(texts: list[str]) -> list[dict]:
    return [{"name": f"chat/{t}", "category": "chat", "chat": True, "text": t} for t in texts]


def first_by_hash(texts: list[str], count: int, exclude: set[str], held_out: bool) -> list[str]:
    """Up to ``count`` texts not in ``exclude`` that are held out (``held_out``) or that the
    generator trains on (not ``held_out``), in hash order (no bias to any topic)."""
    kept = [t for t in texts if is_heldout(f"chat/{t}") == held_out and t not in exclude]
    return sorted(kept, key=lambda t: stable_hash(t))[:count]


def build(tokenizer, count: int) -> dict:
    from training.chat_instructions import all_instructions
    from training.eval_prompts import chat_questions, load
    from training.self_instruct import load_questions
    from training.stage_gen import render

    evaluation = load()["chat"][:count]
    asked = set(chat_questions())
    questions = load_questions()
    sets = {"templated": first_by_hash(all_instructions(), count, asked, held_out=True),
            "self_instruct": first_by_hash(questions, count, asked, held_out=True),
            "self_instruct_trained": first_by_hash(questions, count, asked, held_out=False)}
    out = {"eval_chat": [{"name": p["name"], "prompt_token_ids": p["prompt_token_ids"]}
                         for p in evaluation]}
    for name, texts in sets.items():
        rendered = render(_chat(texts), tokenizer, max_prompt=512)
        out[name] = [{"name": p["name"], "prompt_token_ids": p["ids"]} for p in rendered]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--count", type=int, default=24)
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    from specdec_plugin.models import fetch_smollm2

    prompts = build(AutoTokenizer.from_pretrained(str(fetch_smollm2())), args.count)
    args.out.write_text(json.dumps(prompts, indent=0) + "\n")
    print({name: len(v) for name, v in prompts.items()}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
