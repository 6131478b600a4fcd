"""One ``vllm serve`` with SmolLM2 and the shipped EAGLE-3 drafter (K=3) on our CPU platform,
under bad input and then a bounded soak: nothing is lost, nothing silently changes.

- Bad requests (tests/bad_requests.py) each get their 4xx with a message naming the problem,
  and the server answers a good request right after.
- Request-level speculative fields do not exist in vLLM: they are ignored, and change nothing.
- The soak: a few hundred requests at concurrency 32 (tests/serve_load.py: greedy, sampled,
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

import json
import re
import signal
import time

import pytest

from tests.bad_requests import bad_requests
from tests.prompts import SPEC_PROMPTS
from tests.serve_load import (HANG_UP_TOKENS, LoadRequest, build_mix, greedy_completion, problems,
                              run_load)
from tests.serve_utils import metric_totals, started_server, still_running
from tests.spec_configs import spec_config

pytestmark = pytest.mark.slow

httpx = pytest.importorskip("httpx")

MAX_MODEL_LEN = 1024
SOAK_REQUESTS = 300
CONCURRENCY = 32
# The soak takes about 80 s on 2 idle cores; the deadline leaves room for a loaded CI machine
# and still bounds the test.
SOAK_DEADLINE_S = 360
PINNED_TOKENS = 16
SHUTDOWN_TIMEOUT_S = 60
BAD_NAMES = [bad.name for bad in bad_requests("m", MAX_MODEL_LEN)]


def _post(server, path: str, raw: bytes) -> httpx.Response:
    # trust_env=False: no proxy from the environment sees loopback traffic.
    with httpx.Client(timeout=120, trust_env=False) as client:
        return client.post(server.base_url + path, content=raw,
                           headers={"Content-Type": "application/json"})


def _complete(server, body: dict) -> dict:
    resp = _post(server, "/v1/completions", json.dumps(body).encode())
    assert resp.status_code == 200, resp.text
    return resp.json()


def _assert_serving(server) -> None:
    answer = _complete(server, greedy_completion(server.model, "The capital of France is", 8))
    assert "Paris" in answer["choices"][0]["text"]
    with httpx.Client(timeout=10, trust_env=False) as client:
        assert client.get(server.base_url + "/health").status_code == 200


def _pinned_requests(model: str) -> list[LoadRequest]:
    return [LoadRequest("pinned", "/v1/completions",
                        greedy_completion(model, prompt, PINNED_TOKENS))
            for prompt in SPEC_PROMPTS]


def _wait_idle(server, timeout_s: float = 30.0) -> dict:
    """Metrics once no request runs or waits (the gauges trail the last answer by a step)."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = metric_totals(server.base_url)
        idle = (metrics["vllm:num_requests_running"] == 0
                and metrics["vllm:num_requests_waiting"] == 0)
        if idle or time.monotonic() > deadline:
            return metrics
        time.sleep(0.5)


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory, smollm2_path):
    spec = spec_config("eagle3", smollm2_path)
    server = started_server(
        smollm2_path, ["--speculative-config", json.dumps(spec)],
        log_path=tmp_path_factory.mktemp("serve_eagle3") / "server.log")
    yield server
    server.kill()  # normally test_sigterm_leaves_no_process_behind has stopped it


@pytest.fixture(scope="module")
def texts_without_speculation(tmp_path_factory, smollm2_path) -> list[str]:
    """The fixed greedy prompts' texts from a server without speculative decoding."""
    server = started_server(smollm2_path,
                            log_path=tmp_path_factory.mktemp("serve_plain") / "server.log")
    try:
        results = run_load(server.base_url, _pinned_requests(server.model),
                           concurrency=len(SPEC_PROMPTS), deadline_s=120)
    finally:
        server.stop(SHUTDOWN_TIMEOUT_S)
    assert problems(_pinned_requests(server.model), results) == []
    return [r.texts[0] for r in results]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_request_is_refused_and_server_keeps_serving(spec_server, name):
    bad = {b.name: b for b in bad_requests(spec_server.model, MAX_MODEL_LEN)}[name]
    resp = _post(spec_server, bad.path, bad.raw)
    assert resp.status_code == bad.status, resp.text[:1000]
    error = resp.json()["error"]
    assert error["code"] == bad.status
    assert re.search(bad.message, error["message"]), error["message"][:1000]
    _assert_serving(spec_server)


def test_request_level_speculative_fields_change_nothing(spec_server):
    # vLLM has no per-request speculative setting; unknown fields are dropped by its front end.
    # What matters is that a client who sends one gets the normal, unchanged answer.
    body = greedy_completion(spec_server.model, SPEC_PROMPTS[7], PINNED_TOKENS)
    plain = _complete(spec_server, body)
    odd = _complete(spec_server, {**body, "num_speculative_tokens": -3,
                                  "speculative_config": {"method": "nonsense"}})
    assert odd["choices"][0]["text"] == plain["choices"][0]["text"]
    assert odd["usage"] == plain["usage"]


def test_soak_loses_nothing(spec_server, texts_without_speculation):
    server = spec_server
    pinned = _pinned_requests(server.model)
    alone = [run_load(server.base_url, [req], concurrency=1, deadline_s=60)[0]
             for req in pinned]
    assert problems(pinned, alone) == []
    bad = [LoadRequest("bad:" + b.name, b.path, b.body, expect_status=b.status)
           for b in bad_requests(server.model, MAX_MODEL_LEN)
           if b.body is not None and b.name in ("max_tokens_negative", "top_p_2", "n_0",
                                                "out_of_vocab_token_id", "empty_chat",
                                                "bad_json_schema")]
    mix = build_mix(server.model, SOAK_REQUESTS, seed=15, pinned=pinned, scattered=bad)
    before = metric_totals(server.base_url)

    start = time.monotonic()
    results = run_load(server.base_url, mix, CONCURRENCY, SOAK_DEADLINE_S)
    wall = time.monotonic() - start

    found = problems(mix, results)
    assert found == [], f"{len(found)} bad results in {wall:.0f} s:\n" + "\n".join(found[:30])
    kinds = {req.kind for req in mix}
    assert {"json", "n2", "logprobs", "stop", "penalties", "chat", "chat_stream"} <= kinds
    hung_up = sum(res.cancelled for res in results)
    assert 0.05 * SOAK_REQUESTS <= hung_up <= 0.15 * SOAK_REQUESTS
    # Stop strings did end some answers, and never show in the text.
    stopped = [(req, res) for req, res in zip(mix, results)
               if req.kind == "stop" and res.finish_reasons == ["stop"]]
    assert stopped and all(" is" not in res.texts[0] and "." not in res.texts[0]
                           for _, res in stopped)

    # The same greedy text alone, amid the load, and without speculation.
    amid = [res.texts[0] for req, res in zip(mix, results) if req.kind == "pinned"]
    assert amid == [res.texts[0] for res in alone]
    assert amid == texts_without_speculation

    # Nothing left running or waiting.
    after = _wait_idle(server)
    assert after["vllm:num_requests_running"] == 0, after
    assert after["vllm:num_requests_waiting"] == 0, after
    # Hung-up requests were aborted, not left to run to their HANG_UP_TOKENS: the tokens the
    # engine generated beyond the answers delivered are few per hang-up (a client reads at
    # most 3 chunks of at most 1+K tokens; vLLM counts no client abort in request_success).
    delivered = sum(res.completion_tokens for res in results if not res.cancelled
                    and res.completion_tokens is not None)
    generated = (after["vllm:generation_tokens_total"]
                 - before["vllm:generation_tokens_total"])
    assert delivered <= generated <= delivered + hung_up * HANG_UP_TOKENS // 2, \
        (generated, delivered, hung_up)
    assert after["vllm:spec_decode_num_draft_tokens_total"] > \
        before["vllm:spec_decode_num_draft_tokens_total"], "speculation did not run"
    assert after["vllm:spec_decode_num_accepted_tokens_total"] > \
        before["vllm:spec_decode_num_accepted_tokens_total"]
    _assert_serving(server)


def test_sigterm_leaves_no_process_behind(spec_server):
    assert spec_server.process.poll() is None, "server died:\n" + spec_server.log_tail()
    tree = spec_server.process_tree()
    assert len(tree) >= 2, "expected the API server and its engine core"
    code = spec_server.stop(SHUTDOWN_TIMEOUT_S, sig=signal.SIGTERM)
    assert code == 0, f"exit code {code} after SIGTERM; log tail:\n{spec_server.log_tail()}"
    assert still_running(tree) == [], "processes of the server's tree outlived it"
