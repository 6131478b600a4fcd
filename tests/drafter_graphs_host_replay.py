"""One CPU engine whose drafter graphs are emulated on the host, for test_drafter_graphs_cpu.py.

    python -m tests.drafter_graphs_host_replay '<engine_runner job json>' emulate|eager

``emulate``: the drafter records and replays as on a GPU, except that a "graph" is the recorded
call itself, re-run at replay (vLLM's real propose on our static buffers, with the host values
of the call it was recorded from), its result copied into the recorded output. So every replay
reads exactly what a GPU graph would: the static buffers refreshed from the live call, and
nothing else of the live call. ``eager``: drafter graphs as on CPU (off).

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that the emulation,
installed here, is the one the engine's worker uses. Prints ``RESULT {...}``: engine_runner's
result plus the numbers of recordings and replays.
"""
from __future__ import annotations

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

COUNTS = {"recorded": 0, "replayed": 0}


class _HostGraph:
    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self) -> None:
        self.out.copy_(self.fn())
        COUNTS["replayed"] += 1


class HostReplayGraphs:
    """The four graph hooks of a device layer (specdec_plugin/device/base.py), on the host."""

    def new_graph_pool(self):
        return None

    def new_stream(self):
        return None

    def run_on_stream(self, fn, stream):
        return fn()

    def capture_graph(self, fn, pool, stream):
        out = fn()
        COUNTS["recorded"] += 1
        return _HostGraph(fn, out), out


def main() -> None:
    job, mode = json.loads(sys.argv[1]), sys.argv[2]
    if mode == "emulate":
        from specdec_plugin.spec_decode.drafter_graphs import DrafterGraphs

        DrafterGraphs._device_for_graphs = lambda self, layer: HostReplayGraphs()
    from tests.engine_runner import run_job

    result = run_job(job)
    print("RESULT " + json.dumps(result | {"drafter_graphs": COUNTS}), flush=True)


if __name__ == "__main__":
    main()
