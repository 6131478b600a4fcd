"""Stage train: the four drafters trained together on the shards of stage gen, to a deadline.

    python -m training.stage_train --data /root/specdec_data --out $OUT --deadline-s 540 \
        [--init DIR]

Every step takes one batch of similar-length sequences (``--token-budget`` tokens), runs the
target over it once (bf16 on a GPU; hidden states recomputed, never stored:
``target_features.py``) and gives each drafter one AdamW step on it, against the target's own
next-token distribution (soft cross-entropy, losses in ``train.py``; for the heads
``--label-temperature T`` sharpens it and ``--answer-only`` drops the drafts no engine makes,
those of chains started in the prompt):
- eagle3: 3-layer feature fc -> decoder layer(s) (``--eagle3-layers``) -> reduced-vocab head,
  training-time test
  over ``--ttt eagle3=N`` chained steps (each step attends to its own earlier outputs);
- eagle: EAGLE-1 head, same chaining, plus feature regression (0.1 x CE);
- mtp: MiMo MTP layer; draft_model: a small Llama (shape from ``--draft-*``), or with
  ``--draft-from-target 0,10,20,29`` those target layers at the target's width, its embedding
  frozen and not shipped (``draft_from_target.py``).
Training stops ``--reserve-s`` before the deadline; then held-out agreement (teacher-forced
chains on ``heldout.npz``, per depth) and the export: ``<kind>.safetensors`` (bf16 with the
config in the metadata; int8-packed if bf16 would pass the device's 16 MiB per file) and
``summary.json``. ``--init DIR`` resumes from carried weights (``drafter_io.py``: a previous
run's output or the shipped assets); optimizer state always starts fresh.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from training import configs, draft_from_target
from training.data import capture_hidden, target_norm
from training.drafter_io import load_for_resume, save_drafter
from training.heads import Eagle1Head, Eagle3Head, MtpHead, TargetShape
from training.prompt_sources import CATEGORIES
from training.shards import HELDOUT_NAME, read_shards, train_shards
from training.target_features import ShardBatches, TargetFeatures
from training.train import draft_loss, eval_agreement, head_loss, lr_at, optimizer_step

T0 = time.time()
KINDS = ("eagle3", "eagle", "mtp", "draft_model")
DEFAULT_TTT = {"eagle3": 4, "eagle": 3, "mtp": 1}
FEATURE_WEIGHT = {"eagle": 0.1}


def log(message: str) -> None:
    print(f"[train {time.time() - T0:6.1f}s] {message}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--init", type=Path, help="resume from these weights (see drafter_io.py)")
    p.add_argument("--fresh", default="", help="comma list of kinds not to resume from --init")
    p.add_argument("--model", type=Path, help="target checkpoint (default: fetch_smollm2())")
    p.add_argument("--deadline-s", type=float, default=540.0)
    p.add_argument("--reserve-s", type=float, default=40.0, help="kept for eval + export")
    p.add_argument("--max-steps", type=int, default=None,
                   help="stop after this many steps (0: export the initial weights as they are)")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--token-budget", type=int, default=16384, help="tokens per batch")
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--max-rows", type=int, default=64)
    p.add_argument("--ttt", default=",".join(f"{k}={v}" for k, v in DEFAULT_TTT.items()))
    p.add_argument("--draft-hidden", type=int, default=192)
    p.add_argument("--draft-layers", type=int, default=4)
    p.add_argument("--draft-inter", type=int, default=768)
    p.add_argument("--draft-heads", type=int, default=3)
    p.add_argument("--draft-from-target", default="",
                   help="comma list of target layer ids: the draft model is those layers at "
                        "the target's width (replaces --draft-hidden/-layers/-inter/-heads)")
    p.add_argument("--draft-lr", type=float, default=None,
                   help=f"draft model learning rate (default {configs.LR['draft_model']})")
    p.add_argument("--draft-vocab", type=int, default=configs.EAGLE3_DRAFT_VOCAB)
    p.add_argument("--eagle3-inter", type=int, default=None,
                   help="EAGLE-3's MLP width; a resumed narrower head is widened without "
                        f"changing its output (heads.MLP.widen; default {configs.EAGLE3_INTER} "
                        "or the resumed head's)")
    p.add_argument("--eagle3-layers", type=int, default=None,
                   help="EAGLE-3's decoder layers; a resumed head with fewer grows new layers "
                        "that start as the identity (heads.Eagle3Head.grow: its drafts do not "
                        "change); default 1 or the resumed head's")
    p.add_argument("--eagle3-taps", default="",
                   help="EAGLE-3's target taps, 'after k layers' as vLLM counts them (1..30 for "
                        "SmolLM2; 30 = the last layer's output), increasing, e.g. 2,15,27,30; a "
                        "resumed head keeps its taps and gains the new ones with zero fc "
                        "columns (heads.Eagle3Head.add_taps: its drafts do not change); "
                        "default: the resumed head's, or 2,15,27")
    p.add_argument("--revocab", action="store_true",
                   help="a resumed EAGLE-3 head gets the shards' --draft-vocab most frequent tokens "
                        "as its draft vocabulary; its layers are kept (see revocab_eagle3)")
    p.add_argument("--answer-only", action="store_true",
                   help="heads (eagle3, eagle, mtp): loss only on drafts an engine makes, from "
                        "answer positions; default: every position, prompts included")
    p.add_argument("--label-temperature", type=float, default=1.0,
                   help="heads: train to softmax(target logits / T); T < 1 leans on the argmax "
                        "that greedy verification accepts")
    p.add_argument("--eval-seqs", type=int, default=256)
    p.add_argument("--cpu", action="store_true", help="force the CPU (smoke runs)")
    args = p.parse_args(argv)
    try:
        args.draft_layer_ids = (draft_from_target.parse_layer_ids(args.draft_from_target)
                                if args.draft_from_target else None)
    except ValueError as exc:
        p.error(f"--draft-from-target: {exc}")
    try:
        args.eagle3_taps = parse_taps(args.eagle3_taps) if args.eagle3_taps else None
    except ValueError as exc:
        p.error(f"--eagle3-taps: {exc}")
    if not args.label_temperature > 0:
        p.error(f"--label-temperature {args.label_temperature}: want T > 0 (1 = the target's "
                "own distribution)")
    if args.eagle3_layers is not None and args.eagle3_layers < 1:
        p.error(f"--eagle3-layers {args.eagle3_layers}: an EAGLE-3 head has at least 1 layer")
    if args.draft_vocab % configs.EAGLE3_VOCAB_MULTIPLE:
        p.error(f"--draft-vocab {args.draft_vocab}: want a multiple of "
                f"{configs.EAGLE3_VOCAB_MULTIPLE}, or vLLM cannot split EAGLE-3's LM head over "
                "SmolLM2's 3 tensor-parallel ranks")
    return args


def parse_taps(text: str) -> tuple[int, ...]:
    taps = tuple(int(x) for x in text.split(","))
    n = configs.TARGET["layers"]
    if list(taps) != sorted(set(taps)) or not all(1 <= k <= n for k in taps):
        raise ValueError(f"{text!r}: want increasing layer counts in 1..{n} (vLLM gathers the "
                         "taps in layer order)")
    return taps


def eagle3_vocab(shard: dict, size: int, vocab: int) -> torch.Tensor:
    """The ``size`` most frequent tokens of the training text, sorted (vLLM's d2t wants order)."""
    counts = np.bincount(shard["tokens"], minlength=vocab).astype(np.float64)
    top = np.argsort(-counts, kind="stable")[:size]
    return torch.from_numpy(np.sort(top)).long(), float(counts[top].sum() / counts.sum())


def revocab_eagle3(old: Eagle3Head, vocab_ids: torch.Tensor, target, shape) -> Eagle3Head:
    """``old`` with the draft vocabulary ``vocab_ids``: every layer kept; lm_head rows of tokens
    in both vocabularies copied, new tokens' rows started as a fresh head starts them (the
    target's embedding rows). A resumed head otherwise keeps the vocabulary of the data it was
    first trained on, which can miss many tokens of new data (86.8% coverage in session 10)."""
    inter = old.mlp.gate_proj.out_features
    new = Eagle3Head(shape, inter, vocab_ids, num_layers=old.attention_layers,
                     aux_layers=old.aux_layers)
    configs.init_head("eagle3", new, target)
    kept = {k: v for k, v in old.state_dict().items() if not k.startswith("lm_head.")}
    missing, unexpected = new.load_state_dict(kept, strict=False)
    assert set(missing) == {"lm_head.weight"} and not unexpected, (missing, unexpected)
    row_of = torch.full((shape.vocab,), -1, dtype=torch.long)
    row_of[old.vocab_ids.long().cpu()] = torch.arange(len(old.vocab_ids))
    rows = row_of[vocab_ids.long().cpu()]
    shared = rows >= 0
    with torch.no_grad():
        new.lm_head.weight[shared] = old.lm_head.weight.detach().cpu()[rows[shared]].to(
            new.lm_head.weight.dtype)
    return new


def build_drafters(args, target, vocab_ids_fresh, shape, log):
    """kind -> (module, ttt steps, resumed?)."""
    emb = target.model.embed_tokens.weight.detach()
    ttt = {k: int(v) for k, v in (item.split("=") for item in args.ttt.split(",") if item)}
    if args.draft_layer_ids:
        draft_cfg = draft_from_target.config_for(len(args.draft_layer_ids))
    else:
        draft_cfg = configs.draft_model_config(args.draft_hidden, args.draft_layers,
                                               args.draft_inter, args.draft_heads)
    # A resumed draft cut from the target gets the target's embedding back (drafter_io.py).
    target_embedding = emb.float().cpu()
    out = {}
    for kind in args.kinds.split(","):
        fresh = kind in args.fresh.split(",")
        module = None if fresh else load_for_resume(args.init, kind, draft_cfg, log,
                                                    target_embedding=target_embedding)
        resumed = module is not None
        if resumed and kind == "eagle3" and args.revocab and not torch.equal(
                module.vocab_ids.cpu(), vocab_ids_fresh.cpu()):
            shared = int(torch.isin(vocab_ids_fresh.cpu(), module.vocab_ids.cpu()).sum())
            log(f"revocab: eagle3 draft vocab {len(module.vocab_ids)} -> {len(vocab_ids_fresh)} "
                f"tokens ({shared} rows kept, the rest from the target's embedding)")
            module = revocab_eagle3(module, vocab_ids_fresh, target, shape)
        if resumed and kind == "eagle3" and args.eagle3_inter:
            width = module.mlp.gate_proj.out_features
            if args.eagle3_inter != width:
                log(f"eagle3: MLP widened from {width} to {args.eagle3_inter} units")
                module.mlp.widen(args.eagle3_inter)
        if resumed and kind == "eagle3" and args.eagle3_taps \
                and tuple(args.eagle3_taps) != module.aux_layers:
            log(f"eagle3: taps {list(module.aux_layers)} -> {list(args.eagle3_taps)}, the new "
                "ones' fc columns starting at zero")
            module.add_taps(args.eagle3_taps)
        if resumed and kind == "eagle3" and args.eagle3_layers:
            if args.eagle3_layers != module.attention_layers:
                log(f"eagle3: grown from {module.attention_layers} to {args.eagle3_layers} "
                    "decoder layers, the new ones starting as the identity")
                module.grow(args.eagle3_layers)
        if module is None:
            if kind == "draft_model" and args.draft_layer_ids:
                module = draft_from_target.build(target, args.draft_layer_ids)
                log(f"draft_model: target layers {args.draft_layer_ids} at width "
                    f"{draft_cfg['hidden_size']}, embedding frozen (the target's)")
            elif kind == "draft_model":
                module = configs.build_draft_model(emb.cpu(), draft_cfg)
            elif kind == "eagle":
                module = Eagle1Head(shape, configs.EAGLE_INTER)
            elif kind == "eagle3":
                module = Eagle3Head(shape, args.eagle3_inter or configs.EAGLE3_INTER,
                                    vocab_ids_fresh, num_layers=args.eagle3_layers or 1,
                                    aux_layers=args.eagle3_taps or configs.EAGLE3_AUX_LAYERS)
            elif kind == "mtp":
                module = MtpHead(shape)
            else:
                raise ValueError(kind)
            if kind in ("eagle3", "mtp"):
                configs.init_head(kind, module, target)
        out[kind] = (module, ttt.get(kind, 1), resumed)
    return out


def heldout_data(path: Path, target, device, dtype, max_len: int, limit: int,
                 aux_layers=configs.EAGLE3_AUX_LAYERS):
    """``capture_hidden``'s dict for the held-out greedy answers (what eval_agreement reads)."""
    shard = read_shards([path])
    off = shard["offsets"]
    seqs = [{"tokens": shard["tokens"][off[i]:min(off[i + 1], off[i] + max_len)].tolist(),
             "prompt_len": int(shard["prompt_lens"][i])} for i in range(min(limit, len(off) - 1))]
    data = capture_hidden(target, seqs, device, dtype, batch_size=16, log=log,
                          aux_layers=aux_layers)
    data["greedy"] = torch.ones(len(seqs), dtype=torch.bool, device=device)
    categories = shard["category"][: len(seqs)]
    return data, categories


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()

    from transformers import AutoModelForCausalLM

    model_path = args.model
    if model_path is None:
        from specdec_plugin.models import fetch_smollm2

        model_path = fetch_smollm2()
    target = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype,
                                                  attn_implementation="sdpa").to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    emb = target.model.embed_tokens.weight.detach()

    shard = read_shards(train_shards(args.data))
    n_seqs, n_tokens = len(shard["offsets"]) - 1, int(shard["offsets"][-1])
    batches = ShardBatches(shard, args.token_budget, args.max_len, args.max_rows)
    log(f"data: {n_seqs} sequences, {n_tokens} tokens, {len(batches.chunks)} batches per epoch")
    vocab_ids, coverage = eagle3_vocab(shard, args.draft_vocab, emb.shape[0])

    shape = TargetShape()
    drafters = build_drafters(args, target, vocab_ids, shape, log)
    taps = drafters["eagle3"][0].aux_layers if "eagle3" in drafters else configs.EAGLE3_AUX_LAYERS
    features = TargetFeatures(target, dtype, taps)
    lrs = dict(configs.LR, **({"draft_model": args.draft_lr} if args.draft_lr else {}))
    opts = {}
    for kind, (module, steps, _) in drafters.items():
        module.to(device).train()
        if kind == "eagle3":
            module.vocab_ids = module.vocab_ids.to(device)
        params = [p for p in module.parameters() if p.requires_grad]
        opts[kind] = (torch.optim.AdamW(params, lr=lrs[kind], betas=(0.9, 0.95),
                                        weight_decay=0.0), params)
    if "eagle3" in drafters:
        ids = drafters["eagle3"][0].vocab_ids.cpu().numpy()
        counts = np.bincount(shard["tokens"], minlength=emb.shape[0])
        coverage = float(counts[ids].sum() / counts.sum())
        log(f"eagle3 draft vocab {len(ids)}: {coverage:.4f} of training tokens")

    stop_at = T0 + args.deadline_s - args.reserve_s
    train_start = time.time()
    budget = max(stop_at - train_start, 1.0)
    step, seen_tokens, last_step_s, history = 0, 0, 0.0, []
    log(f"training {list(drafters)} for {budget:.0f}s (until {args.deadline_s - args.reserve_s:.0f}s)")
    while time.time() + last_step_s < stop_at and (args.max_steps is None or step < args.max_steps):
        t_step = time.time()
        frac = (t_step - train_start) / budget
        tokens, lengths, prompt_lens = batches.rows_to_batch(batches.next_rows(), device)
        b = features(tokens, lengths, prompt_lens)
        losses = {}
        for kind, (module, steps, _) in drafters.items():
            opt, params = opts[kind]
            for group in opt.param_groups:
                group["lr"] = lr_at(lrs[kind], step, frac)
            if kind == "draft_model":
                loss = draft_loss(module, b, emb, autocast)
                parts = [loss]
            else:
                loss, parts = head_loss(module, b, emb, steps, autocast,
                                        FEATURE_WEIGHT.get(kind, 0.0), args.answer_only,
                                        args.label_temperature)
            optimizer_step(opt, params, loss)
            losses[kind] = [round(float(p.detach()), 4) for p in parts]
        seen_tokens += int(lengths.sum())
        last_step_s = time.time() - t_step
        if step % 50 == 0:
            elapsed = time.time() - train_start
            history.append({"step": step, "t": round(elapsed, 1), "tokens": seen_tokens,
                            "epoch": batches.epoch, "soft_ce": losses})
            log(f"step {step} epoch {batches.epoch} {seen_tokens / max(elapsed, 1e-9):.0f} tok/s "
                f"soft-CE {losses}")
        step += 1
    train_s = time.time() - train_start
    log(f"trained {step} steps, {seen_tokens} tokens ({seen_tokens / max(n_tokens, 1):.2f} epochs) "
        f"in {train_s:.1f}s")

    results = {}
    held_path = args.data / HELDOUT_NAME
    data = categories = None
    if held_path.exists() and args.eval_seqs > 0:
        data, categories = heldout_data(held_path, target, device, dtype, args.max_len,
                                        args.eval_seqs, taps)

    def norm_fn(x):
        return target_norm(target, x)

    for kind, (module, steps, resumed) in drafters.items():
        module.eval()
        entry = {"ttt_steps": steps if kind != "draft_model" else None, "resumed": resumed}
        if data is not None:
            entry["heldout_by_category"], starts, totals = {}, 0, [0.0] * 4
            walk_steps = walk_tokens = 0
            for c in sorted(set(categories.tolist())):
                sub = [i for i in range(len(categories)) if categories[i] == c]
                ev = eval_agreement(kind, module, data, sub, emb, norm_fn, autocast, 16)
                ev["teacher_forced_acceptance_k4"] = round(1 + sum(ev["cum_agreement"][:4]), 3)
                entry["heldout_by_category"][CATEGORIES[c]] = ev
                starts += ev["chain_starts"]
                totals = [t + a * ev["chain_starts"] for t, a in zip(totals, ev["cum_agreement"])]
                walk_steps += ev["engine_walk"]["steps"]
                walk_tokens += ev["engine_walk"]["tokens"]
            cum = [round(t / max(starts, 1), 4) for t in totals]
            # Teacher-forced greedy chains: 1 + sum of cum[k] is what acceptance at K=4 would be
            # if the engine drafted exactly these chains.
            # engine_walk_acceptance_k4: the same chains at only the starts an engine uses
            # (train.engine_walk), closer to what eval_acceptance.py measures.
            entry["heldout"] = {"chain_starts": starts, "cum_agreement": cum,
                                "teacher_forced_acceptance_k4": round(1 + sum(cum), 3),
                                "engine_walk_acceptance_k4": round(walk_tokens / max(walk_steps, 1), 3)}
            by_cat = entry["heldout_by_category"].items()
            log(f"{kind} held-out {entry['heldout']} by category "
                f"{ {c: v['teacher_forced_acceptance_k4'] for c, v in by_cat} }, engine walk "
                f"{ {c: v['engine_walk']['acceptance_k4'] for c, v in by_cat} }")
        entry["file"] = save_drafter(kind, module.float().cpu(), args.out / f"{kind}.safetensors")
        results[kind] = entry

    summary = {
        "device": torch.cuda.get_device_name() if cuda else "cpu", "dtype": str(dtype),
        "data": {"dir": str(args.data), "sequences": n_seqs, "tokens": n_tokens,
                 "gen_summary": _read_json(args.data / "gen_summary.json")},
        "init": str(args.init) if args.init else None,
        "resume_note": "weights only: AdamW state and the LR schedule start fresh each run",
        "eagle3_draft_vocab": {"size": int(len(vocab_ids)), "train_token_coverage": round(coverage, 4)},
        "args": {k: str(v) for k, v in vars(args).items()},
        "train": {"steps": step, "tokens_seen": seen_tokens, "epochs": round(seen_tokens / max(n_tokens, 1), 3),
                  "train_s": round(train_s, 1),
                  "tokens_per_s": round(seen_tokens / max(train_s, 1e-9), 1), "history": history},
        "results": results, "total_s": round(time.time() - T0, 1),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    log(f"wrote {sorted(p.name for p in args.out.iterdir())} in {summary['total_s']}s")
    return 0


def _read_json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


if __name__ == "__main__":
    sys.exit(main())
