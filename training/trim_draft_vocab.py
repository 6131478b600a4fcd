"""Trim a shipped EAGLE-3 head's draft vocabulary to a size tensor parallelism can split.

    python -m training.trim_draft_vocab --size 16320 [--assets DIR]

Why: vLLM splits the draft LM head over tensor-parallel ranks and asserts that its (64-padded)
row count divides by the rank count. SmolLM2 has 3 KV heads, so its only tensor-parallel size
above 1 is 3, and session 17's 16,384-token head (2^14) could not run there
(tests/test_draft_vocab.py[3], tests/test_parallel_cpu.py[eagle3]). New heads are trained at a
size that divides by 3 x 64 (``configs.EAGLE3_VOCAB_MULTIPLE``); this trims an existing one without
retraining.

How: the packed file's LM-head rows (int8 rows and their scales, exactly as shipped) of the
tokens kept are sliced out and ``d2t``/``t2d`` rebuilt; every other tensor is unchanged, so for
every kept token the drafter's logit is what it was. The rows dropped are the tokens of the
draft vocabulary seen least often in local text that resembles the training data (the Python
standard library and the templated chat prompts, tokenized by the target's tokenizer; ties:
the higher token id, BPE's later merge). The training run's own counts did not come back from
the device.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from training.configs import EAGLE3_VOCAB_MULTIPLE


def kept_rows(vocab_ids: torch.Tensor, counts: np.ndarray, size: int) -> torch.Tensor:
    """Indices (sorted) into ``vocab_ids`` of the ``size`` tokens to keep: the most counted,
    ties to the lower token id."""
    ids = vocab_ids.long().numpy()
    order = sorted(range(len(ids)), key=lambda i: (-int(counts[ids[i]]), int(ids[i])))
    return torch.tensor(sorted(order[:size]), dtype=torch.long)


def trim_tensors(tensors: dict, rows: torch.Tensor, target_vocab: int) -> dict:
    """The packed (or plain) EAGLE-3 tensors with only ``rows`` of the draft vocabulary."""
    d2t = tensors["d2t"].long()
    vocab_ids = torch.arange(len(d2t)) + d2t
    out = dict(tensors)
    for name in [n for n in tensors if n.startswith("lm_head.weight")]:
        out[name] = tensors[name][rows].contiguous()
    kept = vocab_ids[rows]
    out["d2t"] = (kept - torch.arange(len(kept))).to(tensors["d2t"].dtype)
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[kept] = True
    out["t2d"] = t2d
    return out


def local_token_counts(tokenizer, vocab: int, max_files: int = 3000) -> np.ndarray:
    from training.chat_instructions import all_instructions
    from training.prompt_sources import list_python_files

    texts = [Path(path).read_text(errors="ignore") for _, path in list_python_files(max_files)]
    texts += all_instructions()
    counts = np.zeros(vocab, dtype=np.int64)
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        np.add.at(counts, np.asarray(ids, dtype=np.int64), 1)
    return counts


def main(argv=None) -> int:
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from specdec_plugin.models import fetch_smollm2
    from specdec_plugin.models.drafters import shipped_files

    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--assets", type=Path, help="assets tree (default: the shipped one)")
    args = p.parse_args(argv)
    if args.size % EAGLE3_VOCAB_MULTIPLE:
        p.error(f"--size {args.size}: want a multiple of {EAGLE3_VOCAB_MULTIPLE} (tensor parallel 3)")
    weights, config_path = shipped_files("eagle3", args.assets)
    with safe_open(str(weights), "pt") as handle:
        metadata = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    config = json.loads(config_path.read_text())
    vocab_ids = torch.arange(len(tensors["d2t"])) + tensors["d2t"].long()
    if args.size >= len(vocab_ids):
        p.error(f"the head has {len(vocab_ids)} draft tokens; nothing to trim to {args.size}")
    tokenizer = AutoTokenizer.from_pretrained(str(fetch_smollm2()))
    counts = local_token_counts(tokenizer, config["vocab_size"])
    rows = kept_rows(vocab_ids, counts, args.size)
    dropped = sorted(set(range(len(vocab_ids))) - set(rows.tolist()))
    share = counts[vocab_ids[dropped].numpy()].sum() / max(counts[vocab_ids.numpy()].sum(), 1)
    out = trim_tensors(tensors, rows, config["vocab_size"])
    config["draft_vocab_size"] = args.size
    meta_config = json.loads(metadata["config"])
    meta_config["draft_vocab_size"] = args.size
    metadata["config"] = json.dumps(meta_config)
    save_file(out, str(weights), metadata=metadata)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    print(f"eagle3: {len(vocab_ids)} -> {args.size} draft tokens; the {len(dropped)} dropped made "
          f"{share:.5f} of the local text's draft-vocabulary tokens; {weights}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
