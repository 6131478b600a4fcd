"""Drafter graphs end to end on the CPU: a real engine drafts from recorded calls.

CPUs have no graphs, so tests/drafter_graphs_host_replay.py emulates them: a replay re-runs
vLLM's real ``propose`` on our static buffers, with the host values of the recorded call. That
is exactly what a GPU graph reads, so a device input that ``propose`` uses but our buffers do
not carry would draft from stale data here, and change acceptance. fp32 drafting from recorded
calls must equal eager drafting: the same tokens, the same accepted drafts at every position.
The GPU run of the real graphs is in tests/gpu.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specdec_plugin.engine_ports import engine_port_env
from tests.prompts import SPEC_PROMPTS
from tests.spec_configs import spec_config, target_for

pytestmark = pytest.mark.slow

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# Results by (method, mode): the eager EAGLE-3 run is the reference of two tests.
_RESULTS: dict[tuple[str, str], dict] = {}


def _runs(method: str, smollm2_path: str, *modes: str) -> list[dict]:
    """One engine per mode, each in its own process, started together: on 2 cores most of an
    engine's start (imports, loading, one-threaded Python) overlaps with the other's, about
    a third of the pair's time. Results are token ids and counts, which do not depend on how
    busy the cores were."""
    job = {"backend": "ours", "model": target_for(method, smollm2_path),
           "engine": {"dtype": "float32", "max_model_len": 1024,
                      "speculative_config": spec_config(method, smollm2_path)},
           # Four requests at once, then two (batch shapes differ: several graphs).
           "prompts": SPEC_PROMPTS[:4], "max_tokens": 32, "batches": [4, 2], "repeats": 1,
           "warmups": 0, "tokens": True}
    # Engines started together need rendezvous ports of their own (engine_ports.py).
    procs = {mode: subprocess.Popen([sys.executable, "-m", "tests.drafter_graphs_host_replay",
                                     json.dumps(job), mode], cwd=_ROOT, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True,
                                    # A native crash prints the Python stack it happened
                                    # under (session 58's CI simulation saw one SIGFPE
                                    # here, with no traceback).
                                    env={**os.environ, **engine_port_env(),
                                         "PYTHONFAULTHANDLER": "1"})
             for mode in modes if (method, mode) not in _RESULTS}
    try:
        for mode, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=900)
            result = next((json.loads(line[len("RESULT "):]) for line in stdout.splitlines()
                           if line.startswith("RESULT ")), None)
            if result is None:
                # vLLM logs to stdout: its tail says how far the engine got (session 58's
                # SIGFPE showed only stderr, whose last line was the drafter's weights loading).
                raise AssertionError(f"{method} {mode}: exit {proc.returncode}\n"
                                     f"stdout tail:\n{stdout[-3000:]}\nstderr tail:\n{stderr[-3000:]}")
            _RESULTS[(method, mode)] = result
    finally:  # a failure or timeout of one leaves no other engine running
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [_RESULTS[(method, mode)] for mode in modes]


@pytest.mark.parametrize("method", ["eagle", "eagle3", "draft_model"])
def test_drafting_from_recorded_calls_equals_eager_drafting(method, smollm2_path):
    recorded, eager = _runs(method, smollm2_path, "emulate", "eager")
    graphs = recorded["drafter_graphs"]
    assert graphs["recorded"] > 0 and graphs["replayed"] > graphs["recorded"], graphs
    assert eager["drafter_graphs"]["recorded"] == 0
    for batch, entry in eager["batches"].items():
        have = recorded["batches"][batch]
        assert have["token_ids"] == entry["token_ids"], f"{method} batch {batch}: tokens differ"
        assert have["spec"] == entry["spec"], (
            f"{method} batch {batch}: drafts differ: recorded {have['spec']}, eager {entry['spec']}")
        assert entry["spec"]["accepted"] > 0, "nothing accepted: the check would be empty"


def test_a_failed_recording_leaves_later_shapes_recordable(smollm2_path):
    # The first shape's recording fails inside the capture: that shape drafts eagerly and
    # the next shapes still record (on the H100 a reused pool made every later one fail).
    recorded, eager = _runs("eagle3", smollm2_path, "emulate-fail-first", "eager")
    graphs = recorded["drafter_graphs"]
    assert graphs["failed"] == 1 and graphs["recorded"] > 0 and graphs["replayed"] > 0, graphs
    for batch, entry in eager["batches"].items():
        assert recorded["batches"][batch]["token_ids"] == entry["token_ids"], f"batch {batch}"
