"""The teacher-forced acceptance count of training/layer_subset_drafts.py."""
from __future__ import annotations

import random

from training.layer_subset_drafts import acceptance_length


def _simulate(match, start, end, k):
    """Draft-and-verify step by step: a step accepts the drafts up to the first miss (at most
    k) and adds the target's own token."""
    produced, steps, pos = 0, 0, start
    while pos < end:
        accepted = 0
        for j in range(k):
            if pos + j >= end or not match[pos + j]:
                break
            accepted += 1
        produced += min(accepted + 1, end - pos)
        steps += 1
        pos += accepted + 1
    return produced / steps


def test_every_draft_right_gives_k_plus_one_and_none_gives_one():
    assert acceptance_length([True] * 20, 0, 20, 4) == 5.0
    assert acceptance_length([False] * 20, 0, 20, 4) == 1.0


def test_random_matches_agree_with_a_step_by_step_count():
    rng = random.Random()
    for _ in range(200):
        n = rng.randint(1, 80)
        match = [rng.random() < rng.random() for _ in range(n)]
        start = rng.randint(0, n - 1)
        k = rng.randint(1, 6)
        assert abs(acceptance_length(match, start, n, k) - _simulate(match, start, n, k)) < 1e-12
