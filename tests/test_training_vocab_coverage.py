"""training/eval_acceptance.py's draft-vocabulary coverage: EAGLE-3's ``t2d`` read back from a
drafter checkpoint, and the share of generated tokens it holds, against a count by hand."""
from __future__ import annotations

import torch
from safetensors.torch import save_file

from training.eval_acceptance import draft_vocab_mask, vocab_coverage


def test_mask_is_read_from_the_checkpoint_and_coverage_counts_tokens_inside_it(tmp_path):
    vocab = 300
    held = torch.randperm(vocab)[:120]
    t2d = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, held, True)
    save_file({"t2d": t2d, "fc.weight": torch.randn(4, 4)}, str(tmp_path / "model.safetensors"))
    mask = draft_vocab_mask({"method": "eagle3", "model": str(tmp_path)})
    assert torch.equal(mask, t2d)

    outputs = [torch.randint(0, vocab, (int(n),)).tolist() for n in torch.randint(1, 40, (5,))]
    inside = sum(int(t) in set(held.tolist()) for ids in outputs for t in ids)
    total = sum(len(ids) for ids in outputs)
    assert vocab_coverage(mask, outputs) == round(inside / total, 4)


def test_no_draft_vocabulary_no_coverage(tmp_path):
    save_file({"fc.weight": torch.randn(4, 4)}, str(tmp_path / "model.safetensors"))
    assert draft_vocab_mask({"method": "eagle", "model": str(tmp_path)}) is None
    assert vocab_coverage(None, [[1, 2, 3]]) is None
    assert vocab_coverage(torch.ones(8, dtype=torch.bool), [[]]) is None
