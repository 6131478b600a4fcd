"""One ``vllm serve`` with SmolLM2 and the shipped EAGLE-3 drafter (K=3) on our CPU platform,
under bad input and then a bounded soak: nothing is lost, nothing silently changes.

- Bad requests (tests/bad_requests.py) each get their 4xx with a message naming the problem,
  and the server answers a good request right after.
- Request-level speculative fields do not exist in vLLM: they are ignored, and change nothing.
- The soak: 120 requests at concurrency 32 (tests/serve_load.py: greedy, sampled,
  n=2, logprobs, stop strings, penalties, streamed and plain chat, JSON-schema outputs, 10% of
  clients hanging up mid-stream, a few bad requests). Every request not hung up completes with
  text and a finish reason; the server answers afterwards; no request is left running; 16
  fixed greedy prompts give the same text alone, amid the load, and on a server without
  speculation.
- SIGTERM at the end: the server exits 0 and leaves no process of its tree behind.

The module shares one speculative server (an engine costs about 30 s to start on 2 cores);
the SIGTERM test stops it, so it comes last. Traffic goes to 127.0.0.1 only.
"""
from __future__ import annotations

import re
import signal

import pytest

from tests.bad_requests import bad_requests
from tests.prompts import SPEC_PROMPTS
from tests.serve_load import greedy_completion
from tests.serve_soak import (PINNED_TOKENS, assert_serving, complete, cpu_soak_server,
                              recorded_fresh_texts, soak, texts_of_pinned)
from tests.serve_utils import VllmServer, started_server, still_running, take_ahead

pytestmark = pytest.mark.slow

httpx = pytest.importorskip("httpx")

MAX_MODEL_LEN = 1024
# 120 requests at this seed: 14 hang up (11.7%, inside the 5-15% the soak asks), every kind of
# the mix is there at least 7 times (stop 7, json 9, n2 11, logprobs 11, penalties 14, chat 13,
# chat_stream 12), the 6 bad requests and 16 pinned prompts ride in it as before, and at
# concurrency 32 the load is still almost four waves of overlapping requests. They were 300
# until session 23 (CI over its 45 minutes, the soak its longest test at 115-141 s), then 200
# until CI ran over again (the soak 105 s, still the longest test).
SOAK_REQUESTS = 120
CONCURRENCY = 32
# The deadline leaves room for a loaded CI machine and still bounds the test.
SOAK_DEADLINE_S = 360
SHUTDOWN_TIMEOUT_S = 60
STARTUP_TIMEOUT_S = 300
BAD_NAMES = [bad.name for bad in bad_requests("m", MAX_MODEL_LEN)]


def _post(server, path: str, raw: bytes) -> httpx.Response:
    # trust_env=False: no proxy from the environment sees loopback traffic.
    with httpx.Client(timeout=120, trust_env=False) as client:
        return client.post(server.base_url + path, content=raw,
                           headers={"Content-Type": "application/json"})


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory, smollm2_path):
    # Started ahead by tests/test_serve_faults.py where that module ran first in this session.
    server = take_ahead(cpu_soak_server(
        smollm2_path, log_path=tmp_path_factory.mktemp("serve_eagle3") / "server.log"))
    try:
        server.wait_ready(STARTUP_TIMEOUT_S)
    except BaseException:
        server.kill()
        raise
    yield server
    server.kill()  # normally test_sigterm_leaves_no_process_behind has stopped it


@pytest.fixture(scope="module")
def texts_without_speculation(tmp_path_factory, smollm2_path) -> list[str]:
    """The fixed greedy prompts' texts from a fresh server without speculative decoding: the
    one test_serve.py started with the same arguments, when it ran in this session and
    recorded them (tests/serve_soak.py), else one started here."""
    log_path = tmp_path_factory.mktemp("serve_plain") / "server.log"
    recorded = recorded_fresh_texts(VllmServer(smollm2_path, log_path=log_path))
    if recorded is not None:
        return recorded
    server = started_server(smollm2_path, log_path=log_path)
    try:
        return texts_of_pinned(server)
    finally:
        server.stop(SHUTDOWN_TIMEOUT_S)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_request_is_refused_and_server_keeps_serving(spec_server, name):
    bad = {b.name: b for b in bad_requests(spec_server.model, MAX_MODEL_LEN)}[name]
    resp = _post(spec_server, bad.path, bad.raw)
    assert resp.status_code == bad.status, resp.text[:1000]
    error = resp.json()["error"]
    assert error["code"] == bad.status
    assert re.search(bad.message, error["message"]), error["message"][:1000]
    assert_serving(spec_server)


def test_request_level_speculative_fields_change_nothing(spec_server):
    # vLLM has no per-request speculative setting; unknown fields are dropped by its front end.
    # What matters is that a client who sends one gets the normal, unchanged answer.
    body = greedy_completion(spec_server.model, SPEC_PROMPTS[7], PINNED_TOKENS)
    plain = complete(spec_server, body)
    odd = complete(spec_server, {**body, "num_speculative_tokens": -3,
                                  "speculative_config": {"method": "nonsense"}})
    assert odd["choices"][0]["text"] == plain["choices"][0]["text"]
    assert odd["usage"] == plain["usage"]


def test_soak_loses_nothing(spec_server, texts_without_speculation):
    # The checks are shared with the GPU soak (tests/serve_soak.py lists them).
    soak(spec_server, texts_without_speculation, SOAK_REQUESTS, CONCURRENCY, SOAK_DEADLINE_S,
         MAX_MODEL_LEN)


def test_sigterm_leaves_no_process_behind(spec_server):
    assert spec_server.process.poll() is None, "server died:\n" + spec_server.log_tail()
    tree = spec_server.process_tree()
    assert len(tree) >= 2, "expected the API server and its engine core"
    code = spec_server.stop(SHUTDOWN_TIMEOUT_S, sig=signal.SIGTERM)
    assert code == 0, f"exit code {code} after SIGTERM; log tail:\n{spec_server.log_tail()}"
    assert still_running(tree) == [], "processes of the server's tree outlived it"
