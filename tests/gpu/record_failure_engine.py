"""One GPU engine in which one drafter-graph recording fails, for tests/gpu/test_serve_gpu.py.

    python -m tests.gpu.record_failure_engine '<engine_runner job json>'

The job is tests/engine_runner.py's, plus ``fail_requests``: the padded drafter graph that
holds a step of that many requests (and the full K drafts) fails inside its capture, the way
an op that cannot be recorded fails: the device layer's real ``capture_graph`` begins the
capture and the recorded function raises. Padded graphs are recorded at engine start
(drafter_graphs.py ``prerecord_graphs``), so that is where it fails. drafter_graphs.py must
then serve those steps without that graph (an exact-shape graph recorded while serving, or
eager drafting), with one warning, while every other padded graph still replays.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that the patch,
installed here, is the one its worker uses. Prints ``RESULT {...}``: engine_runner's result
plus ``failure``: the keys whose recording failed, how the drafter steps that needed the
failed graph ran (by drafter path: "replay" for an exact-shape graph, "eager"), and how many
graphs were recorded.

Session 49 (H200) found the earlier form of this harness stale: it failed the first
exact-shape recording, which since padded graphs were recorded at start-up no step makes, so
nothing failed.
"""
from __future__ import annotations

import json
import os
import sys
from collections import Counter

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, _ROOT)

STATE = {"current_key": None, "forced": 0, "failed_key": None, "drafter": None,
         "paths_for_failed_key": Counter()}


def _install(fail_requests: int, k: int) -> None:
    from specdec_plugin.device.cuda import CudaDevice
    from specdec_plugin.spec_decode.drafter_graphs import DrafterGraphs

    real_capture_graph, real_capture = CudaDevice.capture_graph, DrafterGraphs._capture
    real_propose_now = DrafterGraphs._propose_now

    def padded_key(self, num_reqs: int, draft_len: int):
        inputs = self._padding()
        bucket = inputs.bucket(num_reqs) if inputs is not None else None
        return None if bucket is None else ("padded", draft_len, bucket)

    def capture(self, key, run, *args, **kwargs):
        STATE["current_key"], STATE["drafter"] = key, self
        try:
            return real_capture(self, key, run, *args, **kwargs)
        finally:
            STATE["current_key"] = None

    def capture_graph(self, fn, pool, stream):
        drafter, key = STATE["drafter"], STATE["current_key"]
        if (STATE["forced"] == 0 and key is not None
                and key == padded_key(drafter, fail_requests, k)):
            STATE["forced"] += 1
            STATE["failed_key"] = key

            def fails():
                raise RuntimeError("recording forced to fail by tests/gpu/record_failure_engine")

            return real_capture_graph(self, fails, pool, stream)
        return real_capture_graph(self, fn, pool, stream)

    def propose_now(self, kwargs):
        drafts = real_propose_now(self, kwargs)
        failed = STATE["failed_key"]
        if failed is not None:
            num_reqs = kwargs["common_attn_metadata"].batch_size()
            if padded_key(self, num_reqs, kwargs["num_speculative_tokens"]) == failed:
                STATE["paths_for_failed_key"][self._last_path] += 1
        return drafts

    DrafterGraphs._capture = capture
    DrafterGraphs._propose_now = propose_now
    CudaDevice.capture_graph = capture_graph


def main() -> None:
    job = json.loads(sys.argv[1])
    k = job["engine"]["speculative_config"]["num_speculative_tokens"]
    _install(job["fail_requests"], k)
    from tests.engine_runner import run_job

    result = run_job(job)
    drafter = STATE["drafter"]
    graphs = drafter._draft_graphs if drafter is not None else {}
    result["failure"] = {
        "forced": STATE["forced"],
        "failed_keys": [list(key[:3]) for key, entry in graphs.items() if entry is None],
        "recorded_padded": sum(entry is not None and key[0] == "padded"
                               for key, entry in graphs.items()),
        "recorded_exact": sum(entry is not None and key[0] != "padded"
                              for key, entry in graphs.items()),
        "paths_for_failed_key": dict(STATE["paths_for_failed_key"]),
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
