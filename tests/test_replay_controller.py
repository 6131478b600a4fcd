"""benchmarks/replay_controller.py on a made-up trace (no engine): the replay's bookkeeping."""
from __future__ import annotations

import random

import pytest

from tests.benchmark_scripts import load_benchmark

@pytest.fixture(scope="module")
def replay_module():
    return load_benchmark("replay_controller")


@pytest.fixture(scope="module")
def table(replay_module):
    """The replay's built-in cost table (the H100's padded 7B)."""
    from specdec_plugin.adaptive.cost_model import CostTable

    return CostTable(*zip(*replay_module.H100_PADDED_7B))


def _trace(rng, repetitive: bool, max_tokens: int):
    prompt = [rng.randrange(100, 5000) for _ in range(40)]
    if repetitive:  # the answer copies the prompt: n-gram drafts land
        output = (prompt * (max_tokens // len(prompt) + 2))[:max_tokens]
    else:  # fresh tokens, never seen before: drafts miss
        output = [rng.randrange(6000, 60000) for _ in range(max_tokens)]
    return {"prompt": prompt, "output": output}


@pytest.mark.parametrize("batch", [1, 8])
def test_replay_counts_steps_tokens_and_drafts(replay_module, table, batch):
    rng = random.Random()
    max_tokens = 64
    policies = replay_module._policies(table)
    copying = [_trace(rng, True, max_tokens) for _ in range(3)]
    fresh = [_trace(rng, False, max_tokens) for _ in range(3)]

    plain = replay_module.replay(copying, batch, None, table, max_tokens)
    assert plain["steps"] == max_tokens and plain["drafts"] == 0
    assert plain["ms_per_token"] == pytest.approx(
        1e3 * table.step_time(batch, 0) * max_tokens / max_tokens)

    static = replay_module.replay(copying, batch, "static", table, max_tokens)
    # The copy starts after one token of the prompt's first n-gram, then every draft lands.
    assert static["steps"] < max_tokens / 3
    assert static["acceptance_length"] > 3.5
    assert static["steps_by_length"] == {str(replay_module.K): static["steps"]}

    missed = replay_module.replay(fresh, batch, "static", table, max_tokens)
    assert missed["steps"] == max_tokens and missed["accepted"] == 0
    assert missed["ms_per_token"] > plain["ms_per_token"]

    controller = policies["adaptive (default)"]()
    adaptive = replay_module.replay(copying, batch, controller, table, max_tokens)
    assert adaptive["steps"] < max_tokens / 2  # it drafts where drafts land
    off = replay_module.replay(fresh, batch, controller, table, max_tokens)
    assert off["steps_by_length"].get("0", 0) > max_tokens / 2  # and stops where they miss


def test_the_measured_table_is_read_from_a_bench_result(replay_module, tmp_path):
    line = ("specdec_plugin: step costs measured in 3.2 s (tokens:ms) target 1:6.90 5:7.01 "
            "64:8.40 320:13.75")
    result = {"engines": {"ngram/ours": {"controller_log": [
        "specdec_plugin: adaptive drafting on (K=4 ...)", line]},
        "none/ours": {"controller_log": []}}}
    path = tmp_path / "side_by_side.json"
    path.write_text(__import__("json").dumps(result))
    table = replay_module.measured_table(str(path), "ngram/ours")
    assert table.token_counts == (1, 5, 64, 320)
    assert table.target_s == pytest.approx((6.90e-3, 7.01e-3, 8.40e-3, 13.75e-3))
    with pytest.raises(ValueError, match="none/ours"):
        replay_module.measured_table(str(path), "none/ours")


def test_a_cell_in_rounds_sums_its_rounds(replay_module, table):
    # --cell-prompts: batch 2 over 5 prompts is three closed batches (2, 2, 1), as the GPU
    # bench runs a cell; plain steps cost the table's time at each round's own batch size.
    rng = random.Random()
    max_tokens = 16
    traces = [_trace(rng, False, max_tokens) for _ in range(5)]
    cell = replay_module.replay_cell(traces, 2, None, table, max_tokens, cell_prompts=5)
    assert cell["steps"] == 3 * max_tokens and cell["drafts"] == 0
    expected = 1e3 * (2 * table.step_time(2, 0) + table.step_time(1, 0)) / 3
    assert cell["ms_per_token"] == pytest.approx(expected)
    # A batch at least as large as the cell: one closed batch, as without --cell-prompts.
    whole = replay_module.replay_cell(traces, 8, None, table, max_tokens, cell_prompts=5)
    assert whole["steps"] == max_tokens


def test_base_adds_the_controller_of_that_revision(replay_module, table):
    policies = replay_module._policies(table, base="HEAD")
    controller = policies["adaptive at HEAD"]()
    assert type(controller).__name__ == "DraftLengthController"
    assert type(controller).__module__ == "specdec_plugin.adaptive.controller"
    assert controller.choose(["r0"]) in range(replay_module.K + 1)
