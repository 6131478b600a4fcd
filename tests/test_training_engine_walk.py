"""training/train.engine_walk: held-out chains counted only at the starts an engine drafts from
(right after prefill, then after each step's accepted drafts and bonus token)."""
from __future__ import annotations

import torch

from training.train import engine_walk


def test_walk_follows_accepted_drafts_and_bonus_tokens():
    accepted = torch.zeros(2, 12, dtype=torch.long)
    starts = torch.zeros(2, 12, dtype=torch.bool)
    starts[0, 1:10] = True        # row 0: prompt of 2 tokens, chains may start at 1..9
    accepted[0, 1], accepted[0, 4], accepted[0, 5] = 2, 0, 4
    accepted[0, 2] = 4            # a start the walk skips over: must not count
    starts[1, 3:6] = True         # row 1: prompt of 4 tokens
    accepted[1, 3] = 1
    steps, tokens = engine_walk(accepted, starts, torch.tensor([2, 4]))
    # row 0: s=1 (2 accepted, 3 tokens) -> s=4 (0, 1) -> s=5 (4, 5) -> s=10 not a start;
    # row 1: s=3 (1, 2) -> s=5 (0, 1) -> s=6 not a start.
    assert (steps, tokens) == (5, 12)


def test_walk_stops_at_once_when_the_first_start_is_not_a_start():
    accepted = torch.full((1, 8), 3, dtype=torch.long)
    starts = torch.zeros(1, 8, dtype=torch.bool)
    assert engine_walk(accepted, starts, torch.tensor([3])) == (0, 0)
