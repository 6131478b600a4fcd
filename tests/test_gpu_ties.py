"""The GPU tests' tie rules (tests/gpu/ties.py), checked without a GPU."""
from __future__ import annotations

import random

import torch

from tests.gpu.ties import bf16_step, first_differences


def test_bf16_step_is_the_spacing_of_bfloat16_numbers():
    for _ in range(200):
        value = random.uniform(-64.0, 64.0)
        x = torch.tensor(value, dtype=torch.bfloat16)
        # Exactly representable values only: the spacing above a power of two is the one this
        # binade uses.
        if x.item() == 0:
            continue
        up = torch.nextafter(x, torch.tensor(float("inf"), dtype=torch.bfloat16))
        down = torch.nextafter(x, torch.tensor(float("-inf"), dtype=torch.bfloat16))
        spacing = (up.float() - x.float()) if x > 0 else (x.float() - down.float())
        assert bf16_step(x.item()) == spacing.item(), value


def test_first_differences_names_each_unequal_prompt_and_its_first_token():
    want = [[random.randrange(1000) for _ in range(8)] for _ in range(6)]
    have = [list(t) for t in want]
    have[1][5] += 1
    have[4][0] += 1
    have[4][6] += 1
    have[5] = have[5][:3]  # shorter: differs where it ends
    assert first_differences(want, have) == [(1, 5), (4, 0), (5, 3)]
