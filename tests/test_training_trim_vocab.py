"""training/trim_draft_vocab.py: a shipped EAGLE-3 head trimmed to a draft vocabulary that
tensor parallelism can split keeps, for every kept token, exactly its packed LM-head row."""
from __future__ import annotations

import numpy as np
import torch

from training.trim_draft_vocab import kept_rows, trim_tensors


def test_kept_rows_are_the_most_counted_ties_to_the_lower_id():
    vocab_ids = torch.tensor([3, 5, 8, 13, 21])
    counts = np.zeros(30, dtype=np.int64)
    counts[[3, 5, 8, 13, 21]] = [7, 0, 7, 0, 9]
    assert kept_rows(vocab_ids, counts, 4).tolist() == [0, 1, 2, 4]  # 13 loses the 0-count tie


def test_trim_keeps_each_kept_tokens_packed_row_and_rebuilds_the_maps():
    vocab, draft, width, keep = 200, 24, 16, 18
    ids = torch.sort(torch.randperm(vocab)[:draft]).values
    tensors = {"lm_head.weight.qweight": torch.randint(-127, 128, (draft, width), dtype=torch.int8),
               "lm_head.weight.scale": torch.rand(draft).half() + 0.01,
               "norm.weight": torch.rand(width),
               "d2t": ids - torch.arange(draft),
               "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True)}
    rows = torch.sort(torch.randperm(draft)[:keep]).values
    out = trim_tensors(tensors, rows, vocab)
    kept_ids = torch.arange(keep) + out["d2t"]
    assert torch.equal(kept_ids, ids[rows])
    assert torch.equal(out["t2d"].nonzero().flatten(), ids[rows])
    assert out["d2t"].dtype == tensors["d2t"].dtype
    for j, row in enumerate(rows.tolist()):
        assert torch.equal(out["lm_head.weight.qweight"][j], tensors["lm_head.weight.qweight"][row])
        assert out["lm_head.weight.scale"][j] == tensors["lm_head.weight.scale"][row]
    assert out["norm.weight"] is tensors["norm.weight"]
