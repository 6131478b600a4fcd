"""The training stage's acceptance model, run on the evaluation's own prompts.

    python -m training.walk_on_eval [--drafters DIR] [--categories chat,code] [--per-category 24]

The target (transformers, fp32) answers each prompt of ``heldout_eval_prompts.json`` greedily,
stopping at EOS as the engine does; the EAGLE-3 head then drafts teacher-forced chains over the
answers (``train.eval_agreement``), counted at every start and at only the starts an engine
drafts from (``engine_walk``). ``eval_acceptance.py`` measures the same prompts through the
engine.

Why: the training stage's walk over its own held-out chat reads 2.9 while the engines read
2.2 on the evaluation's chat (issue 17). On identical prompts and text the two must agree if
the training's model of drafting is what vLLM serves; session 38 found they do (CPU fp32:
chat 2.217 walked against 2.218 in the engine, code 3.682 against 3.696). With ``--prompts``
(e.g. ``chat_shift.py``'s sets) and ``--max-tokens`` it showed where the 2.9 comes from: the
stage walks answers of up to 256 tokens, and the second half of an answer drafts much better.
"""
from __future__ import annotations

import contextlib
import json
import time

import torch

EOS = 2


def main(argv=None) -> int:
    from training.data import capture_hidden, target_norm
    from training.eval_prompts import analysis_parser, target_and_eagle3
    from training.train import eval_agreement

    args = analysis_parser(__doc__.split("\n\n")[0], "chat,code").parse_args(argv)
    model, head = target_and_eagle3(args.drafters)
    emb = model.get_input_embeddings().weight.detach()
    prompts = json.loads(args.prompts.read_text())
    report = {}
    for cat in args.categories.split(","):
        t0 = time.time()
        seqs = []
        for item in prompts[cat][: args.per_category]:
            ids = item["prompt_token_ids"]
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), max_new_tokens=args.max_tokens,
                                     do_sample=False, eos_token_id=EOS, pad_token_id=EOS)
            seqs.append({"tokens": out[0].tolist(), "prompt_len": len(ids)})
        data = capture_hidden(model, seqs, "cpu", torch.float32, batch_size=4,
                              log=lambda message: None, aux_layers=head.aux_layers)
        data["greedy"] = torch.ones(len(seqs), dtype=torch.bool)
        ev = eval_agreement("eagle3", head, data, list(range(len(seqs))), emb,
                            lambda x: target_norm(model, x), contextlib.nullcontext, 4)
        report[cat] = {"prompts": len(seqs),
                       "generated_tokens": sum(len(s["tokens"]) - s["prompt_len"] for s in seqs),
                       "cum_agreement": ev["cum_agreement"],
                       "teacher_forced_acceptance_k4": round(1 + sum(ev["cum_agreement"][:4]), 3),
                       "engine_walk": ev["engine_walk"]}
        print(f"{cat}: walked {ev['engine_walk']['acceptance_k4']} tokens per step over "
              f"{ev['engine_walk']['steps']} steps, every start "
              f"{report[cat]['teacher_forced_acceptance_k4']}, cum {ev['cum_agreement']} "
              f"({time.time() - t0:.0f}s)", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"drafters": str(args.drafters), "k": 4,
                                        "max_tokens": args.max_tokens, "categories": report},
                                       indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
