"""Train the four SmolLM2-135M drafters in one run: data, training, agreement, export.

    python -m training.device_main --gguf PATH | --checkpoint DIR  --humaneval FILE --out DIR

Writes to --out: ``draft_model.safetensors``, ``eagle.safetensors``, ``eagle3.safetensors``,
``mtp.safetensors`` (bf16; each carries its config JSON in the safetensors metadata under
"config") and ``summary.json`` (data size, times, losses, agreement per depth). Every stage is
timed against --deadline-s so the whole run fits one device call.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

from training import configs
from training.data import capture_hidden, generate_sequences, target_norm
from training.heads import Eagle1Head, Eagle3Head, MtpHead, TargetShape
from training.prompts import build_prompts
from training.train import eval_agreement, train_draft_model, train_head

T0 = time.time()


def log(message: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {message}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--gguf", type=Path)
    p.add_argument("--checkpoint", type=Path)
    p.add_argument("--humaneval", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--deadline-s", type=float, default=540.0)
    p.add_argument("--reserve-s", type=float, default=45.0, help="kept for eval + export")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run of every stage")
    p.add_argument("--n-sampled", type=int, default=3)
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument("--gen-batch", type=int, default=1100)
    p.add_argument("--draft-vocab", type=int, default=configs.EAGLE3_DRAFT_VOCAB)
    return p.parse_args(argv)


def prepare_checkpoint(args) -> Path:
    if args.checkpoint:
        return args.checkpoint
    from specdec_plugin.models.smollm2 import convert_gguf_to_safetensors
    out = Path("/tmp/smollm2-hf")
    out.mkdir(parents=True, exist_ok=True)
    convert_gguf_to_safetensors(args.gguf, out)
    log(f"converted GGUF -> {out}")
    return out


def fingerprint(model) -> dict:
    """Cheap sums that say whether two conversions gave the same weights."""
    sd = model.state_dict()
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.29.mlp.down_proj.weight"]
    return {n: round(float(sd[n].float().abs().sum()), 3) for n in names}


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    def autocast():
        if cuda:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    from transformers import AutoModelForCausalLM, AutoTokenizer
    ckpt = prepare_checkpoint(args)
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    target = AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype, attn_implementation="sdpa")
    target.to(device).eval()
    summary = {"device": torch.cuda.get_device_name() if cuda else "cpu",
               "target_fingerprint": fingerprint(target)}
    log(f"target loaded: {summary}")

    prompts = build_prompts(tokenizer, args.humaneval, n_chat=6 if args.smoke else None)
    if args.smoke:
        prompts = prompts[:3] + prompts[-2:]
        args.n_sampled = 1
    heldout_prompts = {i for i in range(len(prompts)) if i % 10 == 3}
    seqs = generate_sequences(target, tokenizer, prompts, n_sampled=args.n_sampled,
                              max_new=6 if args.smoke else args.max_new,
                              batch_size=args.gen_batch, max_prompt=384, device=device, log=log)
    for s in seqs:
        s["heldout"] = s["prompt"] in heldout_prompts
    n_tokens = sum(len(s["tokens"]) for s in seqs)
    n_generated = sum(len(s["tokens"]) - s["prompt_len"] for s in seqs)
    summary["data"] = {"prompts": len(prompts), "heldout_prompts": len(heldout_prompts),
                       "sequences": len(seqs), "tokens": n_tokens,
                       "generated_tokens": n_generated, "gen_s": round(time.time() - T0, 1)}
    log(f"data: {summary['data']}")
    sample = next(s for s in seqs if s["greedy"])
    log("sample: " + repr(tokenizer.decode(sample["tokens"])[:400]))

    data = capture_hidden(target, seqs, device, dtype, batch_size=48, log=log)
    data["greedy"] = torch.tensor([s["greedy"] for s in seqs], device=device)
    train_rows = [i for i, s in enumerate(seqs) if not s["heldout"]]
    test_rows = [i for i, s in enumerate(seqs) if s["heldout"]]
    emb = target.model.embed_tokens.weight.detach()
    final_norm_w = target.model.norm.weight.detach().clone()

    def norm_fn(x):
        return target_norm(target, x)

    # Draft vocab for EAGLE-3: the most frequent next tokens in the training text.
    rows_t = torch.tensor(train_rows, device=device)
    x_train, len_train = data["tokens"][rows_t], data["lengths"][rows_t]
    pos = torch.arange(x_train.shape[1], device=device)[None, :]
    real = (pos >= 1) & (pos < len_train[:, None])
    counts = torch.bincount(x_train[real], minlength=emb.shape[0])
    vocab_ids = torch.sort(torch.topk(counts.float(), args.draft_vocab).indices).values
    coverage = float(counts[vocab_ids].sum() / counts.sum())
    summary["eagle3_draft_vocab"] = {"size": args.draft_vocab, "train_token_coverage": round(coverage, 4)}
    log(f"eagle3 vocab coverage {coverage:.4f}")

    shape = TargetShape()
    remaining = args.deadline_s - (time.time() - T0) - args.reserve_s
    share = configs.TIME_SHARES
    budget = {k: max(2.0, remaining * v) for k, v in share.items()}
    if args.smoke:
        budget = {k: 3.0 for k in share}
    log(f"training budgets (s): { {k: round(v) for k, v in budget.items()} }")
    bs = 4 if args.smoke else configs.HEAD_BATCH

    results = {}
    # 1. draft model
    draft = configs.build_draft_model(emb).to(device)
    results["draft_model"] = train_draft_model(draft, data, train_rows, emb, budget["draft_model"],
                                               configs.LR["draft_model"],
                                               4 if args.smoke else configs.DRAFT_BATCH,
                                               norm_fn, autocast, log)
    draft.eval()
    results["draft_model"]["eval"] = eval_agreement("draft_model", draft, data, test_rows, emb,
                                                    norm_fn, autocast, bs)
    log(f"draft_model eval {results['draft_model']['eval']}")
    configs.save_draft_model(draft, args.out / "draft_model.safetensors")
    del draft

    heads = {
        "eagle": (Eagle1Head(shape, configs.EAGLE_INTER), configs.TTT_STEPS["eagle"], 0.1),
        "eagle3": (Eagle3Head(shape, configs.EAGLE3_INTER, vocab_ids), configs.TTT_STEPS["eagle3"], 0.0),
        "mtp": (MtpHead(shape), configs.TTT_STEPS["mtp"], 0.0),
    }
    for kind, (head, steps, feature_weight) in heads.items():
        configs.init_head(kind, head, target)
        head.to(device)
        if kind == "eagle3":
            head.vocab_ids = vocab_ids.to(device)
        results[kind] = train_head(kind, head, data, train_rows, emb, budget[kind], steps,
                                   configs.LR[kind], bs, norm_fn, autocast, log,
                                   feature_weight=feature_weight)
        head.eval()
        results[kind]["eval"] = eval_agreement(kind, head, data, test_rows, emb, norm_fn,
                                               autocast, bs)
        results[kind]["ttt_steps"] = steps
        log(f"{kind} eval {results[kind]['eval']}")
        configs.save_head(kind, head, args.out / f"{kind}.safetensors")
        del head
        if cuda:
            torch.cuda.empty_cache()
    del final_norm_w

    summary["results"] = results
    summary["total_s"] = round(time.time() - T0, 1)
    summary["files"] = {p.name: p.stat().st_size for p in sorted(args.out.glob("*.safetensors"))}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    log("SUMMARY")
    for kind in ("draft_model", "eagle", "eagle3", "mtp"):
        ev = results[kind]["eval"]
        log(f"  {kind:12s} steps={results[kind]['steps']:5d} cum={ev['cum_agreement']} "
            f"cond={ev['cond_agreement']} top1={ev['top1_vs_target_argmax_all_heldout']} "
            f"ce={ev['heldout_soft_ce_depth1']}")
    log(f"  files {summary['files']}  total {summary['total_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
