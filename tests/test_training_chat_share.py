"""stage_gen --chat-share: the share of training jobs that are chat, the others keeping their ratios."""
from __future__ import annotations

import random

import pytest

from training.stage_gen import SHARES, parse_args, shares_with_chat, training_jobs


def _prompts(per_category: int) -> list[dict]:
    rng = random.Random()
    prompts = [{"name": f"{c}/{i}-{rng.random()}", "category": c}
               for c in SHARES for i in range(per_category)]
    rng.shuffle(prompts)
    return prompts


def test_chat_share_scales_the_others_and_sums_to_one():
    shares = shares_with_chat(0.6)
    assert shares["chat"] == 0.6
    assert sum(shares.values()) == pytest.approx(1.0)
    others = [c for c in SHARES if c != "chat"]
    for a in others:
        for b in others:
            assert shares[a] / shares[b] == pytest.approx(SHARES[a] / SHARES[b])


@pytest.mark.parametrize("share", [0.0, 1.0, -0.1, 1.5])
def test_a_share_outside_0_1_is_refused_naming_the_flag(share, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--data", "/tmp/x", "--chat-share", str(share)])
    assert "--chat-share" in capsys.readouterr().err


@pytest.mark.parametrize("share", [0.4, 0.6])
def test_the_first_jobs_follow_the_shares(share):
    # Plenty of prompts in every category, so no category runs out in the window looked at.
    jobs = training_jobs(_prompts(400), chat_samples=2, other_samples=1,
                         shares=shares_with_chat(share))
    window = jobs[:1000]
    chat = sum(p["category"] == "chat" for p, _ in window) / len(window)
    assert chat == pytest.approx(share, abs=0.01)
    # Each chat prompt brings one greedy answer and chat_samples sampled ones, adjacent in order.
    chat_jobs = [(p["name"], g) for p, g in jobs if p["category"] == "chat"]
    assert chat_jobs[0][1] and not chat_jobs[1][1] and not chat_jobs[2][1]
    assert chat_jobs[0][0] == chat_jobs[1][0] == chat_jobs[2][0] != chat_jobs[3][0]


def test_default_is_the_old_mix():
    assert parse_args(["--data", "/tmp/x"]).shares == pytest.approx(SHARES)
