"""The start-up cost table at every draft length's token counts (SPECDEC_ADAPTIVE_TABLE_LENGTHS,
adaptive/measure.py): which counts are added, how a graph device times each one (in the full
graph of its own query length), through measure_and_publish with a stand-in runner, and which
methods the switch's value covers."""
from __future__ import annotations

import contextlib
import random
from types import SimpleNamespace

import pytest

from specdec_plugin.adaptive import measure
from tests.adaptive_publish import publish


def test_length_points_are_every_power_of_two_batch_at_every_shorter_length():
    max_reqs, query_len = random.choice([8, 16, 64]), random.randint(3, 6)
    max_tokens = random.randint(4, max_reqs * query_len)
    points = measure.length_points(max_reqs, query_len, max_tokens)
    batches = [2 ** i for i in range(max_reqs.bit_length()) if 2 ** i <= max_reqs]
    assert set(points) == {n * q for n in batches for q in range(2, query_len)
                           if n * q <= max_tokens}
    for t, q in points.items():
        assert 2 <= q < query_len and t % q == 0 and t // q in batches


class _Runner:
    """What measure_and_publish reads of vLLM's model runner; records each timed pass as
    (tokens, query-length context, uniform decode)."""

    def __init__(self, graphs: bool):
        self.max_num_reqs, self.max_num_tokens = 8, 64
        self._q_dispatchers = {1: None, 2: None, 3: None, 4: None} if graphs else {}
        self.device_layer = SimpleNamespace(supports_graphs=graphs)
        self.device, self.drafter, self.calls, self._q = "cpu", None, [], None

    @contextlib.contextmanager
    def adaptive_graph_context(self, q: int):
        self._q = q
        yield
        self._q = None

    def _dummy_run(self, t: int, uniform_decode: bool = False) -> None:
        self.calls.append((t, self._q, uniform_decode))


def _publish(monkeypatch, graphs: bool, lengths: bool | str, method: str = "eagle3"):
    if lengths is True:
        monkeypatch.setenv("SPECDEC_ADAPTIVE_TABLE_LENGTHS", "1")
    elif lengths:  # a method list
        monkeypatch.setenv("SPECDEC_ADAPTIVE_TABLE_LENGTHS", lengths)
    else:
        monkeypatch.delenv("SPECDEC_ADAPTIVE_TABLE_LENGTHS", raising=False)
    runner = _Runner(graphs)
    return runner, publish(monkeypatch, runner, method, k=4)["token_counts"]


BASE = [1, 2, 4, 5, 8, 10, 20, 40]  # token_counts(8, 5, 64)
EXTRA = {3: 3, 6: 3, 12: 3, 16: 4, 24: 3, 32: 4}  # length_points(8, 5, 64) less BASE


def test_off_by_default_the_table_keeps_its_counts(monkeypatch):
    assert measure.token_counts(8, 5, 64) == BASE
    _, counts = _publish(monkeypatch, graphs=True, lengths=False)
    assert counts == BASE


@pytest.mark.parametrize("graphs", [True, False])
def test_each_added_count_is_timed_at_its_own_query_length(monkeypatch, graphs):
    runner, counts = _publish(monkeypatch, graphs, lengths=True)
    assert counts == sorted(BASE + list(EXTRA))
    timed = set(runner.calls)
    for t, q in EXTRA.items():
        if not graphs:  # eager: any token count runs as it is
            assert (t, None, False) in timed
        elif t <= runner.max_num_reqs:  # a plain batch of t requests, as the base counts
            assert (t, 1, True) in timed
        else:  # t/q requests verifying q-1 drafts each, in that length's full graph
            assert (t, q, True) in timed and {c[1] for c in runner.calls if c[0] == t} == {q}
    # The base counts are timed as before: 40 = 8 requests x (1 + K) in vLLM's own graphs.
    assert {c for c in runner.calls if c[0] == 40} == ({(40, None, True)} if graphs
                                                       else {(40, None, False)})


@pytest.mark.parametrize("value, method, timed", [
    ("eagle3", "eagle3", True), ("eagle3", "ngram", False), ("ngram, suffix", "ngram_gpu", True),
    ("suffix", "eagle3", False), ("0", "eagle3", False)])
def test_a_method_list_times_every_length_for_the_named_methods_only(monkeypatch, value, method,
                                                                       timed):
    _, counts = _publish(monkeypatch, graphs=True, lengths=value, method=method)
    assert counts == (sorted(BASE + list(EXTRA)) if timed else BASE)


@pytest.mark.parametrize("variable, check", [
    ("SPECDEC_ADAPTIVE_TABLE_LENGTHS", "_check_table_length_methods"),
    ("SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST", "_check_draft_graph_methods")])
def test_a_name_that_is_no_adaptive_method_is_refused_naming_the_variable(monkeypatch, variable,
                                                                           check):
    """Both start-up table switches that take a method list (this one and drafting timed as its
    graphs, tests/test_adaptive_draft_graphs.py)."""
    from specdec_plugin.adaptive import config

    monkeypatch.setenv(variable, "eagle3,eagle-3")
    with pytest.raises(ValueError, match=variable + r" names \['eagle-3'\]"):
        getattr(config, check)()
    monkeypatch.setenv(variable, "eagle3, mtp")
    getattr(config, check)()


def test_cuda_times_every_length_for_eagle3_and_the_cpu_leaves_it_unset():
    # EAGLE-3 on the H200 (session 40): within 1.022x of the better of plain and K every step
    # in all 8 cells with it; other methods not yet measured. The CPU has not run it.
    from specdec_plugin.device.cpu import CpuDevice
    from specdec_plugin.device.cuda import CudaDevice

    assert CudaDevice.process_env["SPECDEC_ADAPTIVE_TABLE_LENGTHS"] == "eagle3"
    assert "SPECDEC_ADAPTIVE_TABLE_LENGTHS" not in CpuDevice.process_env
