"""The start-up cost table with drafting timed as the padded drafter graphs a step replays
(SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST; adaptive/measure.py, adaptive/cost_model.py): how a step's
time is predicted from them, how they are timed, and when measure_and_publish times them."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from specdec_plugin.adaptive import measure
from specdec_plugin.adaptive.cost_model import SPEC_STEP_OVERHEAD, CostTable
from tests.adaptive_publish import publish


def _random_table(max_k: int, buckets: list[int]) -> CostTable:
    counts = tuple(sorted(random.sample(range(1, 400), 8)))
    rising = lambda n: tuple(sorted(random.uniform(1e-4, 1e-2) for _ in range(n)))  # noqa: E731
    return CostTable(counts, rising(len(counts)), rising(len(counts)),
                     draft_graph_reqs=tuple(buckets),
                     draft_graph_s=tuple(rising(len(buckets)) for _ in range(max_k)))


def test_a_drafting_step_costs_the_graph_of_its_length_at_the_bucket_that_holds_it():
    max_k, buckets = random.randint(2, 5), [1, 2, 3, 4, 6, 8, 12, 16]
    table = _random_table(max_k, buckets)
    for _ in range(50):
        n, k = random.randint(1, 16), random.randint(1, max_k)
        bucket = min(b for b in buckets if b >= n)
        drafting = table.draft_graph_s[k - 1][buckets.index(bucket)]
        assert table.step_time(n, k) == pytest.approx(
            table.target(n * (1 + k)) + drafting + SPEC_STEP_OVERHEAD * table.target(n))
    # Plain steps keep the drafter's sync pass, as without the graphs' times.
    without = CostTable(table.token_counts, table.target_s, table.drafter_s)
    assert table.step_time(5, 0) == without.step_time(5, 0)
    # Past the largest graph: along the last slope of that length's times.
    row = table.draft_graph_s[0]
    slope = max((row[-1] - row[-2]) / (buckets[-1] - buckets[-2]), 0.0)
    assert table.step_time(20, 1) == pytest.approx(
        table.target(40) + row[-1] + slope * 4 + SPEC_STEP_OVERHEAD * table.target(20))


def test_without_graph_times_drafting_is_costed_pass_by_pass():
    table = _random_table(3, [1, 2, 4])
    plain = CostTable(table.token_counts, table.target_s, table.drafter_s)
    n, k = random.randint(1, 8), random.randint(1, 3)
    assert plain.step_time(n, k) == pytest.approx(
        plain.target(n * (1 + k)) + plain.drafter(n * (1 + k)) + (k - 1) * plain.drafter(n)
        + SPEC_STEP_OVERHEAD * plain.target(n))
    assert plain.step_time(n, k) != pytest.approx(table.step_time(n, k))


def test_the_graph_times_survive_the_json_handoff_and_bad_shapes_are_refused():
    table = _random_table(4, [1, 2, 4, 8])
    again = CostTable.from_json(table.to_json())
    assert again == table and again.step_time(3, 2) == table.step_time(3, 2)
    with pytest.raises(ValueError, match="increasing"):
        CostTable((1,), (1.0,), draft_graph_reqs=(2, 1), draft_graph_s=((1.0, 2.0),))
    with pytest.raises(ValueError, match="one drafter-graph time per request count"):
        CostTable((1,), (1.0,), draft_graph_reqs=(1, 2), draft_graph_s=((1.0,),))


class _GraphClock:
    """A fake clock and graph replay: k drafts at ``padded`` requests take cost[(padded, k)]
    ms, plus ``slow_ms`` on the first replay of each (a warm-up that must not be kept)."""

    def __init__(self, buckets: list[int], max_k: int, slow_ms: float = 50.0):
        self.now_ms, self.slow_ms, self.seen = 0.0, slow_ms, set()
        self.cost = {(b, k): random.uniform(0.05, 2.0) for b in buckets for k in range(1, max_k + 1)}
        self.calls: list[tuple[int, int]] = []

    def perf_counter(self) -> float:
        return self.now_ms / 1e3

    def run(self, padded: int, k: int) -> None:
        self.calls.append((padded, k))
        self.now_ms += self.cost[(padded, k)] + (0.0 if (padded, k) in self.seen else self.slow_ms)
        self.seen.add((padded, k))


def test_each_length_is_timed_at_each_bucket_fastest_run_and_non_decreasing(monkeypatch):
    buckets, max_k = [1, 2, 3, 4, 6, 8], random.randint(2, 4)
    clock = _GraphClock(buckets, max_k)
    monkeypatch.setattr(measure.time, "perf_counter", clock.perf_counter)
    base = CostTable((1, 8), (1e-3, 2e-3))
    table = measure.time_draft_graphs(base, clock.run, buckets, max_k, 60.0, sync=lambda: None)
    assert table.draft_graph_reqs == tuple(buckets)
    assert len(table.draft_graph_s) == max_k
    assert {(b, k) for b, k in clock.calls} == set(clock.cost)
    for k, row in enumerate(table.draft_graph_s, 1):
        expected = measure.monotone([clock.cost[(b, k)] / 1e3 for b in buckets])
        assert list(row) == pytest.approx(expected)
    assert (table.token_counts, table.target_s) == (base.token_counts, base.target_s)


class _Drafter:
    num_speculative_tokens = 3

    def __init__(self, buckets: list[int], fail: bool = False):
        self.buckets, self.fail, self.replays = buckets, fail, []

    def dummy_run(self, t: int) -> None:
        pass

    def padded_draft_timer(self):
        def run(padded: int, k: int) -> None:
            if self.fail:
                raise LookupError("no padded drafter graph")
            self.replays.append((padded, k))
        return run, self.buckets


class _Runner:
    def __init__(self, graphs: bool, drafter):
        self.max_num_reqs, self.max_num_tokens = 8, 64
        self._q_dispatchers = {1: None} if graphs else {}
        self.device_layer = SimpleNamespace(supports_graphs=graphs)
        self.device, self.drafter = "cpu", drafter

    def adaptive_graph_context(self, q: int):
        import contextlib
        return contextlib.nullcontext()

    def _dummy_run(self, t: int, uniform_decode: bool = False) -> None:
        pass


def _publish(monkeypatch, value: str | None, graphs: bool = True, method: str = "eagle3",
             fail: bool = False):
    if value is None:
        monkeypatch.delenv("SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST", raising=False)
    else:
        monkeypatch.setenv("SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST", value)
    monkeypatch.delenv("SPECDEC_ADAPTIVE_TABLE_LENGTHS", raising=False)
    drafter = _Drafter([1, 2, 3, 4, 6, 8], fail)
    return drafter, publish(monkeypatch, _Runner(graphs, drafter), method, k=3, use_eagle=True)


@pytest.mark.parametrize("value, method, timed", [
    (None, "eagle3", False), ("0", "eagle3", False), ("1", "eagle3", True),
    ("eagle3", "eagle3", True), ("eagle3", "mtp", False), ("mtp, draft_model", "mtp", True)])
def test_the_switch_times_the_graphs_for_the_named_methods_only(monkeypatch, value, method,
                                                                 timed):
    drafter, table = _publish(monkeypatch, value, method=method)
    assert (table["draft_graph_s"] is not None) == timed
    if timed:
        assert table["draft_graph_reqs"] == drafter.buckets
        assert {k for _, k in drafter.replays} == {1, 2, 3}
    else:
        assert drafter.replays == []


def test_no_graph_times_on_a_device_without_graphs(monkeypatch):
    drafter, table = _publish(monkeypatch, "1", graphs=False)
    assert table["draft_graph_s"] is None and drafter.replays == []


def test_a_failed_graph_timing_keeps_the_pass_by_pass_table(monkeypatch):
    _, table = _publish(monkeypatch, "1", fail=True)
    assert table["draft_graph_s"] is None
    assert table["source"] == "measured" and table["drafter_s"] is not None

