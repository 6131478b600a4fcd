"""One GPU engine in which one drafter-graph recording fails, for tests/gpu/test_serve_gpu.py.

    python -m tests.gpu.record_failure_engine '<engine_runner job json>'

The job is tests/engine_runner.py's, plus ``fail_num_tokens``: the first recording of a step
with that many target tokens (and the full K drafts) fails inside the capture, the way an op
that cannot be recorded fails: the device layer's real ``capture_graph`` begins the capture
and the recorded function raises. drafter_graphs.py must then draft that shape eagerly for
good, with one warning, while every other shape still replays from its graph.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that the patch,
installed here, is the one its worker uses. Prints ``RESULT {...}``: engine_runner's result
plus ``failure``: the keys whose recording failed (K, longest query, tokens), how many
drafter steps had such a key (each drafted eagerly), and how many graphs were recorded.
"""
from __future__ import annotations

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _ROOT)

STATE = {"current_key": None, "forced": 0, "eager_steps_for_failed_keys": 0, "drafter": None}


def _install(fail_num_tokens: int, k: int) -> None:
    from specdec_plugin.device.cuda import CudaDevice
    from specdec_plugin.spec_decode.drafter_graphs import DrafterGraphs

    real_capture, real_record = CudaDevice.capture_graph, DrafterGraphs._record
    real_key = DrafterGraphs._graph_key

    def record(self, key, call):
        STATE["current_key"], STATE["drafter"] = key, self
        try:
            return real_record(self, key, call)
        finally:
            STATE["current_key"] = None

    def capture_graph(self, fn, pool, stream):
        key = STATE["current_key"]
        if STATE["forced"] == 0 and key is not None and key[0] == k and key[2] == fail_num_tokens:
            STATE["forced"] += 1

            def fails():
                raise RuntimeError("recording forced to fail by tests/gpu/record_failure_engine")

            return real_capture(self, fails, pool, stream)
        return real_capture(self, fn, pool, stream)

    def graph_key(self, call):
        key = real_key(self, call)
        if key is not None and key in self._draft_graphs and self._draft_graphs[key] is None:
            STATE["eager_steps_for_failed_keys"] += 1
        return key

    DrafterGraphs._record = record
    DrafterGraphs._graph_key = graph_key
    CudaDevice.capture_graph = capture_graph


def main() -> None:
    job = json.loads(sys.argv[1])
    k = job["engine"]["speculative_config"]["num_speculative_tokens"]
    _install(job["fail_num_tokens"], k)
    from tests.engine_runner import run_job

    result = run_job(job)
    drafter = STATE["drafter"]
    graphs = drafter._draft_graphs if drafter is not None else {}
    result["failure"] = {
        "forced": STATE["forced"],
        "failed_keys": [list(key[:3]) for key, entry in graphs.items() if entry is None],
        "recorded": sum(entry is not None for entry in graphs.values()),
        "eager_steps_for_failed_keys": STATE["eager_steps_for_failed_keys"],
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
