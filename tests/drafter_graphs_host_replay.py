"""One CPU engine whose drafter graphs are emulated on the host, for test_drafter_graphs_cpu.py.

    python -m tests.drafter_graphs_host_replay '<engine_runner job json>' emulate|emulate-fail-first|eager

``emulate``: the drafter records and replays as on a GPU, except that a "graph" is the recorded
call itself, re-run at replay (vLLM's real propose on our static buffers, with the host values
of the call it was recorded from), its result copied into the recorded output. So every replay
reads exactly what a GPU graph would: the static buffers refreshed from the live call, and
nothing else of the live call. ``emulate-fail-first``: the same, with the first recording
failing. ``eager``: drafter graphs as on CPU (off).

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

COUNTS = {"recorded": 0, "replayed": 0, "failed": 0}


class _HostGraph:
    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self) -> None:
        self.out.copy_(self.fn())
        COUNTS["replayed"] += 1


class _Pool:
    """A graph memory pool under torch's caching-allocator rule: the graphs recorded into it
    hold it, and once the last of them is gone (a failed capture's graph included) its id
    cannot be captured into again."""

    def __init__(self) -> None:
        self.graphs, self.released = 0, False


class HostReplayGraphs:
    """The four graph hooks of a device layer (specdec_plugin/device/base.py), on the host.

    ``fail_first``: the first capture fails inside the recording, as an op that cannot be
    recorded would."""

    # The padded path's pad_drafter_batch runs from the torch reference here.
    kernel_providers = ("torch",)

    def __init__(self, fail_first: bool = False) -> None:
        self.fail_next = fail_first

    def new_graph_pool(self):
        return _Pool()

    def new_stream(self):
        return None

    def run_on_stream(self, fn, stream):
        return fn()

    def capture_graph(self, fn, pool, stream):
        if pool.released:
            raise RuntimeError("capture into a released graph pool (allocator: use_count > 0)")
        pool.graphs += 1
        try:
            if self.fail_next:
                self.fail_next = False
                COUNTS["failed"] += 1
                raise RuntimeError("recording forced to fail (tests/drafter_graphs_host_replay)")
            out = fn()
        except BaseException:
            pool.graphs -= 1  # the failed graph is dropped
            pool.released = pool.graphs == 0
            raise
        COUNTS["recorded"] += 1
        return _HostGraph(fn, out), out


def main() -> None:
    job, mode = json.loads(sys.argv[1]), sys.argv[2]
    if mode in ("emulate", "emulate-fail-first"):
        from specdec_plugin.spec_decode.drafter_graphs import DrafterGraphs

        graphs = HostReplayGraphs(fail_first=mode == "emulate-fail-first")
        DrafterGraphs._device_for_graphs = lambda self, layer: graphs
    from tests.engine_runner import run_job

    result = run_job(job)
    print("RESULT " + json.dumps(result | {"drafter_graphs": COUNTS}), flush=True)


if __name__ == "__main__":
    main()
