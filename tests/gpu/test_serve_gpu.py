"""On an NVIDIA GPU: serving with speculation loses nothing under load, and a drafter graph that
fails to record costs nothing but its speed (issue 15).

- A drafter-graph recording fails (forced: tests/gpu/record_failure_engine.py): the padded
  graph, recorded at engine start, that holds the most common step of 64 concurrent greedy
  requests (K drafts). One warning; that padded graph is not retried, and its steps are
  served without it (an exact-shape graph recorded while serving, or eager drafting); the
  other padded graphs still replay; no request fails, and the output equals the output
  without speculation (fp32; a difference is allowed only where the target's top-2 logits
  tie, as in test_spec_decode_gpu.py).
- The soak of tests/serve_soak.py (the CPU one's checks) at concurrency 64 against
  ``vllm serve`` with SmolLM2 and the shipped EAGLE-3 drafter (K=3), adaptive drafting on.

The engines and servers of this module start at once (the GPU has room for all of them, each
with a fixed KV cache), so their compilations overlap. ``SPECDEC_GPU_REPORT_DIR=dir`` saves
what each test measured as JSON there.

    python -m pytest -q -m gpu tests/gpu/test_serve_gpu.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.spec_configs import K, spec_config

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUESTS = 64
MAX_TOKENS = 64
SOAK_REQUESTS = 600
SOAK_CONCURRENCY = 64
SOAK_DEADLINE_S = 300
MAX_MODEL_LEN = 1024
START_TIMEOUT_S = 600  # the first start on a fresh machine compiles for minutes
# Each process gets a fixed KV cache, so several share the GPU and none sizes from another's use.
SHARED_GPU_ARGS = ["--kv-cache-memory-bytes", str(2 << 30), "--gpu-memory-utilization", "0.15",
                   "--max-model-len", str(MAX_MODEL_LEN)]


def save_report(name: str, data: dict) -> None:
    folder = os.environ.get("SPECDEC_GPU_REPORT_DIR")
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{name}.json"), "w") as f:
            json.dump(data, f, indent=1)


def _engine_job(smollm2: str, spec: dict | None) -> dict:
    from tests.prompts_gpu import BENCH_PROMPTS

    engine = {"dtype": "float32", "max_model_len": MAX_MODEL_LEN,
              "kv_cache_memory_bytes": 1 << 30, "gpu_memory_utilization": 0.1,
              "enable_prefix_caching": False}
    if spec is not None:
        engine["speculative_config"] = spec
    # K drafts every step (adaptive drafting off), so the full-batch step recurs.
    return {"backend": "ours", "model": smollm2, "engine": engine, "prompts": BENCH_PROMPTS,
            "max_tokens": MAX_TOKENS, "batches": [REQUESTS], "repeats": 1, "warmups": 0,
            "tokens": True, "env": {"SPECDEC_ADAPTIVE": "0"}}


def _run_failing_engine(job: dict, log_path: str) -> dict:
    env = {**os.environ, **job["env"]}
    env.pop("VLLM_PLUGINS", None)
    proc = subprocess.run([sys.executable, "-m", "tests.gpu.record_failure_engine",
                           json.dumps(job)], cwd=_ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)
    output = proc.stdout + proc.stderr
    with open(log_path, "w") as log:
        log.write(output[-200000:])
    import re

    warnings = re.findall(r"drafter graph for key .* not recorded.*", output)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):]) | {"warnings": warnings}
    return {"error": f"exit {proc.returncode}", "tail": output[-4000:]}


@pytest.fixture(scope="module")
def started(tmp_path_factory, smollm2_path):
    """Everything this module needs, started at once: the two soak servers (with and without
    speculation) and the two engines of the recording-failure test (run to completion in
    threads)."""
    from tests.engine_runner import run_in_subprocess
    from tests.serve_utils import VllmServer

    logs = tmp_path_factory.mktemp("serve_gpu")
    spec = spec_config("eagle3", smollm2_path)
    spec_server = VllmServer(smollm2_path, [*SHARED_GPU_ARGS, "--speculative-config",
                                            json.dumps(spec)],
                             log_path=logs / "soak_eagle3.log",
                             env={"SPECDEC_ADAPTIVE": "1"}).start()
    plain_server = VllmServer(smollm2_path, SHARED_GPU_ARGS,
                              log_path=logs / "soak_plain.log").start()
    failing = _engine_job(smollm2_path, spec)
    failing["fail_requests"] = REQUESTS
    pool = ThreadPoolExecutor(2)
    engines = {
        "failing": pool.submit(_run_failing_engine, failing, str(logs / "failing_engine.log")),
        "plain": pool.submit(run_in_subprocess, _engine_job(smollm2_path, None), 1200,
                             str(logs / "plain_engine.log")),
    }
    try:
        yield {"spec_server": spec_server, "plain_server": plain_server, "engines": engines,
               "model": smollm2_path}
    finally:
        for server in (spec_server, plain_server):
            server.stop(60)
            server.kill()
        pool.shutdown(wait=True)


def test_recording_failure_under_load_serves_that_batch_size_without_its_graph(started):
    from tests.gpu.ties import assert_equal_but_ties
    from tests.prompts_gpu import BENCH_PROMPTS

    failing = started["engines"]["failing"].result()
    plain = started["engines"]["plain"].result()
    save_report("record_failure", {"failing": failing, "plain": plain})
    assert "batches" in failing, failing
    assert "batches" in plain, plain
    failure = failing["failure"]
    # The failure was forced once, reported once, and that graph was never recorded again.
    assert failure["forced"] == 1, failure
    assert len(failing["warnings"]) == 1, failing["warnings"]
    assert len(failure["failed_keys"]) == 1, failure
    kind, drafts, padded_reqs = failure["failed_keys"][0]
    assert (kind, drafts) == ("padded", K) and padded_reqs >= REQUESTS, failure
    # Its steps were served without it (every request decodes MAX_TOKENS tokens together, at
    # most 1+K per step), never from the failed graph, and the other padded graphs replayed.
    paths = failure["paths_for_failed_key"]
    assert sum(paths.values()) >= 4 and "replay_padded" not in paths, failure
    assert failure["recorded_padded"] > 0, failure

    (have,) = [entry["token_ids"] for entry in failing["batches"].values()]
    (want,) = [entry["token_ids"] for entry in plain["batches"].values()]
    assert len(have) == REQUESTS and all(len(t) == MAX_TOKENS for t in have), \
        "a request did not complete"
    assert_equal_but_ties(started["model"], BENCH_PROMPTS, want, have,
                          "a request differs from no speculation")
    (entry,) = failing["batches"].values()
    assert entry["spec"]["accepted"] > 0, "no draft was accepted"


def test_soak_at_concurrency_64_with_eagle3_and_adaptive_drafting(started):
    from tests.engine_runner import drafter_graph_counts
    from tests.serve_soak import soak, texts_of_pinned

    spec_server, plain_server = started["spec_server"], started["plain_server"]
    for server in (plain_server, spec_server):
        server.wait_ready(START_TIMEOUT_S)
    texts = texts_of_pinned(plain_server)
    plain_server.stop(60)
    summary = soak(spec_server, texts, SOAK_REQUESTS, SOAK_CONCURRENCY, SOAK_DEADLINE_S,
                   MAX_MODEL_LEN)
    log = spec_server.log_path.read_text(errors="replace")
    summary["adaptive_on"] = "adaptive drafting on" in log
    graphs = drafter_graph_counts(log)
    summary["drafter_graphs_recorded"] = graphs["recorded"]
    summary["drafter_graphs_failed"] = graphs["failed"]
    save_report("soak_gpu", summary)
    assert summary["adaptive_on"], "adaptive drafting never turned on"
    assert summary["drafter_graphs_failed"] == 0
