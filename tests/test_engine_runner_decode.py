"""tests/engine_runner.py's decode-phase figure on made-up request timestamps: from the last
request's first token to the last token of any, over the tokens in between; None without
timestamps."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from tests.engine_runner import decode_ms_per_token


def _output(first: float, last: float, tokens: int):
    metrics = SimpleNamespace(first_token_ts=first, last_token_ts=last,
                              num_generation_tokens=tokens)
    return SimpleNamespace(metrics=metrics)


def test_decode_phase_leaves_out_the_prefill():
    rng = random.Random()
    tokens = rng.randrange(8, 200)
    step = rng.uniform(0.002, 0.02)
    # Requests prefilled over two steps: the batch decodes together from the later one.
    firsts = [rng.choice([10.0, 10.0 + step]) + rng.uniform(0, 1e-4) for _ in range(6)]
    outputs = [_output(f, f + step * (tokens - 1), tokens) for f in firsts]
    start, end = max(firsts), max(f + step * (tokens - 1) for f in firsts)
    assert decode_ms_per_token(outputs) == pytest.approx(1000 * (end - start) / (tokens - 1))
    # A slow prefill (a later first token for everyone) does not change it.
    shifted = [_output(f + 5.0, f + 5.0 + step * (tokens - 1), tokens) for f in firsts]
    assert decode_ms_per_token(shifted) == pytest.approx(decode_ms_per_token(outputs))


def test_no_figure_without_timestamps():
    assert decode_ms_per_token([SimpleNamespace(metrics=None)]) is None
    assert decode_ms_per_token([_output(1.0, 1.0, 1)]) is None
    assert decode_ms_per_token([]) is None


def test_batch_one_over_several_prompts_sends_them_one_at_a_time():
    from tests.engine_runner import cell_rounds

    rng = random.Random()
    prompts = [f"prompt {rng.random()}" for _ in range(rng.randrange(3, 9))]
    count = rng.randrange(2, 12)
    rounds = cell_rounds({"prompts": prompts, "batch1_prompts": count}, 1)
    assert rounds == [[prompts[i % len(prompts)]] for i in range(count)]
    # Other batch sizes are one round of that many requests, whatever the setting.
    assert cell_rounds({"prompts": prompts, "batch1_prompts": count}, 4) == [
        [prompts[i % len(prompts)] for i in range(4)]]
    # Unset: batch 1 is the first prompt alone, as before.
    assert cell_rounds({"prompts": prompts}, 1) == [[prompts[0]]]
    # With cell_prompts, each batch size below the count sends ceil(count / b) rounds of b,
    # the prompts round-robin; batch sizes at or above it stay one round.
    cells = rng.randrange(5, 20)
    batch = rng.randrange(2, cells)
    rounds = cell_rounds({"prompts": prompts, "cell_prompts": cells}, batch)
    assert len(rounds) == -(-cells // batch) and all(len(r) == batch for r in rounds)
    assert [p for r in rounds for p in r] == [prompts[i % len(prompts)]
                                               for i in range(len(rounds) * batch)]
    assert cell_rounds({"prompts": prompts, "cell_prompts": cells}, cells + 1) == [
        [prompts[i % len(prompts)] for i in range(cells + 1)]]
    # At batch 1 the larger of the two counts.
    assert len(cell_rounds({"prompts": prompts, "cell_prompts": cells, "batch1_prompts": 2},
                           1)) == cells
    # A workload's prompts replace the job's own.
    other = [f"other {rng.random()}" for _ in range(3)]
    assert cell_rounds({"prompts": prompts, "batch1_prompts": 2}, 1, {"prompts": other}) == [
        [other[0]], [other[1]]]


def test_acceptance_among_drafts_that_reach_each_position():
    from tests.engine_runner import reached_acceptance

    rng = random.Random()
    k = rng.randrange(2, 6)
    lengths = {length: rng.randrange(0, 50) for length in range(k + 1)}
    lengths[k] += 1  # at least one draft reaches every position
    per_position = [rng.randrange(0, 1 + sum(n for L, n in lengths.items() if L >= i))
                    for i in range(1, k + 1)]
    got = reached_acceptance(per_position, lengths)
    for i in range(1, k + 1):
        reaching = sum(n for L, n in lengths.items() if L >= i)
        assert got[i - 1] == per_position[i - 1] / reaching
    # Drafts of K every step (all length K): the per-draft rate.
    assert reached_acceptance([3, 1], {2: 10}) == [0.3, 0.1]
    # Unknown lengths (vLLM's own backend): None; a position no draft reached: None.
    assert reached_acceptance([3, 1], {}) is None
    assert reached_acceptance([3, 0], {1: 10}) == [0.3, None]


def test_start_phase_splits_the_time_before_the_decode_phase():
    from tests.engine_runner import start_phase_ms

    rng = random.Random()
    count = rng.randrange(2, 17)
    queued = sorted(100.0 + rng.uniform(0, 0.05) for _ in range(count))
    firsts = [q + rng.uniform(0.005, 0.03) for q in queued]
    lasts = [f + rng.uniform(0.3, 0.6) for f in firsts]
    outputs = [SimpleNamespace(metrics=SimpleNamespace(queued_ts=q, first_token_ts=f,
                                                       last_token_ts=last))
               for q, f, last in zip(queued, firsts, lasts)]
    rng.shuffle(outputs)  # the outputs' order is the prompts', not the arrivals'
    wall = max(lasts) - queued[0] + rng.uniform(0.001, 0.02)
    phase = start_phase_ms(outputs, wall)
    assert phase["arrival"] == pytest.approx(1000 * (queued[-1] - queued[0]))
    assert phase["first_token"] == pytest.approx(1000 * (max(firsts) - queued[0]))
    assert phase["outside_core"] == pytest.approx(1000 * (wall - (max(lasts) - queued[0])))
    # Without the call's own wall time there is no outside-the-core figure.
    assert "outside_core" not in start_phase_ms(outputs)
    # A request the core kept no timestamps for: no figure at all.
    outputs[0].metrics.queued_ts = 0.0
    assert start_phase_ms(outputs, wall) is None
    assert start_phase_ms([SimpleNamespace(metrics=None)], wall) is None
