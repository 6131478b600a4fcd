"""Where an EAGLE-3 head's first draft token misses: its agreement with the target's greedy
token, by how sure the target itself was, per category of the held-out set.

    python -m training.depth1_by_confidence [--drafters DIR] [--per-category 24] [--max-tokens 128]

For each held-out prompt (``heldout_eval_prompts.json``) the target (transformers, fp32, CPU
or GPU) answers greedily; the head then predicts each answer token two ahead of the target
features it reads, teacher-forced, as vLLM's first draft step does. Each prediction is put in a
bucket by the target's top-1 probability for that token, and split by whether the draft
vocabulary holds the token and whether the prompt contains it.

Why: chat is EAGLE-3's weakest category (issue 17: 2.2 tokens per step against a bar of 2.5).
If the head missed mostly where the target itself hesitates, chat would be hard for any
drafter; if it misses where the target is sure, the head has more to learn. Session 37 found
the second: where the target's top token had 90% or more, the head agreed on 83% of chat's
tokens against 96-98% of prose's and code's.
"""
from __future__ import annotations

import json

import numpy as np
import torch
import torch.nn.functional as F


BUCKETS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.01)


def by_bucket(hits: np.ndarray, top1: np.ndarray, mask: np.ndarray | None = None) -> list[dict]:
    """Per bucket of the target's top-1 probability: the share of all predictions in it, and the
    agreement among those that ``mask`` keeps (all where None); None where it keeps none."""
    keep = np.ones_like(hits, dtype=bool) if mask is None else mask
    index = np.digitize(top1, BUCKETS) - 1
    rows = []
    for i in range(len(BUCKETS) - 1):
        inside = index == i
        chosen = inside & keep
        rows.append({"p_top1": [BUCKETS[i], min(BUCKETS[i + 1], 1.0)],
                     "share": round(float(inside.mean()), 4) if len(hits) else 0.0,
                     "agreement": round(float(hits[chosen].mean()), 4) if chosen.any() else None})
    return rows


@torch.no_grad()
def predictions(model, head, features, prompt_ids: list[int], answer: list[int]):
    """(hit, target top-1 probability, token) for every answer token the head drafts first."""
    from training.target_features import pad_rows
    from training.train import head_inputs
    from training.heads import run_chain

    emb = model.get_input_embeddings().weight
    seq = np.array(prompt_ids + answer)
    tokens, lengths = pad_rows([seq], emb.device)
    batch = features(tokens, lengths, torch.tensor([len(prompt_ids)]))
    inputs, emb_next, _, target_feat = head_inputs(batch, emb)
    (_, logits), = run_chain(head, inputs, emb_next, emb, 1)
    drafted = head.vocab_ids[logits.argmax(-1)][0]           # at q: the draft for token q + 2
    top1 = torch.softmax(F.linear(target_feat, emb)[0].float(), -1).max(-1).values
    out = []
    for q in range(len(prompt_ids) - 2, len(seq) - 2):
        token = int(seq[q + 2])
        out.append((int(drafted[q]) == token, float(top1[q]), token))
    return out


def main(argv=None) -> int:
    from training.eval_prompts import analysis_parser, target_and_eagle3
    from training.target_features import TargetFeatures

    args = analysis_parser(__doc__.split("\n\n")[0], "chat,code,prose").parse_args(argv)
    model, head = target_and_eagle3(args.drafters)
    features = TargetFeatures(model, torch.float32, head.aux_layers)
    held = head.vocab_ids.tolist()
    in_vocab = np.zeros(model.config.vocab_size, dtype=bool)
    in_vocab[held] = True
    prompts = json.loads(args.prompts.read_text())
    report = {}
    for cat in args.categories.split(","):
        rows = []
        for item in prompts[cat][: args.per_category]:
            ids = item["prompt_token_ids"]
            answer = model.generate(torch.tensor([ids]), max_new_tokens=args.max_tokens,
                                    min_new_tokens=args.max_tokens, do_sample=False,
                                    pad_token_id=2)[0, len(ids):].tolist()
            prompt_set = set(ids)
            rows += [(hit, top1, in_vocab[token], token in prompt_set)
                     for hit, top1, token in predictions(model, head, features, ids, answer)]
        hits, top1, covered, in_prompt = (np.array(col) for col in zip(*rows))
        report[cat] = {"agreement": round(float(hits.mean()), 4), "predictions": len(hits),
                       "mean_top1": round(float(top1.mean()), 4),
                       "all": by_bucket(hits, top1),
                       "in_vocab_not_in_prompt": by_bucket(hits, top1, covered & ~in_prompt),
                       "in_vocab_in_prompt": by_bucket(hits, top1, covered & in_prompt)}
        print(f"{cat}: depth-1 agreement {report[cat]['agreement']} over {len(hits)} tokens, "
              f"target top-1 probability {report[cat]['mean_top1']} on average")
        for row, fresh in zip(report[cat]["all"], report[cat]["in_vocab_not_in_prompt"]):
            print(f"   target p_top1 {row['p_top1'][0]:.1f}-{row['p_top1'][1]:.1f}: "
                  f"{row['share']:.2f} of tokens, agreement {row['agreement']} "
                  f"(in the draft vocabulary, not in the prompt: {fresh['agreement']})")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
