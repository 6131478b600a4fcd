"""The soak against a running ``vllm serve`` with speculation on, and what it must show: shared
by the CPU soak (tests/test_serve_under_load.py, concurrency 32) and the GPU one
(tests/gpu/test_serve_gpu.py, concurrency 64).

``soak(server, texts_without_speculation, requests, concurrency, deadline_s, seed)`` sends the
fixed greedy prompts alone, then the mixed load (tests/serve_load.py) with the same prompts
pinned in its middle and a few bad requests scattered in it, and asserts:
- every request not hung up completes with text and a finish reason (bad ones get their 4xx);
- the kinds of the mix were all there, 5-15% of clients hung up, stop strings ended answers
  and never show in the text;
- the fixed prompts give the same text alone, amid the load and without speculation;
- nothing is left running or waiting, hung-up requests were aborted rather than run to the end;
- speculation ran and drafts were accepted; the server still answers.
Returns a summary (counts, wall time, acceptance) for reports.
"""
from __future__ import annotations

import json
import time

import httpx

from tests.bad_requests import bad_requests
from tests.prompts import SPEC_PROMPTS
from tests.serve_load import (HANG_UP_TOKENS, LoadRequest, build_mix, greedy_completion, problems,
                              run_load)
from tests.serve_utils import metric_totals

PINNED_TOKENS = 16
# Bad requests whose body is JSON (so they ride in the load like any client's).
BAD_IN_LOAD = ("max_tokens_negative", "top_p_2", "n_0", "out_of_vocab_token_id", "empty_chat",
               "bad_json_schema")


def cpu_soak_server(smollm2_path: str, log_path) -> "VllmServer":
    """The CPU soak's server (tests/test_serve_under_load.py), built, not started: SmolLM2 with
    the shipped EAGLE-3 drafter. tests/test_serve_faults.py starts it ahead (serve_utils.py)."""
    from tests.serve_utils import VllmServer
    from tests.spec_configs import spec_config

    return VllmServer(smollm2_path,
                      ["--speculative-config", json.dumps(spec_config("eagle3", smollm2_path))],
                      log_path=log_path)


def pinned_requests(model: str) -> list[LoadRequest]:
    return [LoadRequest("pinned", "/v1/completions",
                        greedy_completion(model, prompt, PINNED_TOKENS))
            for prompt in SPEC_PROMPTS]


def texts_of_pinned(server) -> list[str]:
    """The fixed prompts' texts from ``server`` (e.g. one without speculation)."""
    reqs = pinned_requests(server.model)
    results = run_load(server.base_url, reqs, concurrency=len(reqs), deadline_s=120)
    assert problems(reqs, results) == []
    return [r.texts[0] for r in results]


# The fixed prompts' texts from fresh servers, by server configuration (``config_key``): a
# module that starts a plain server anyway records them there for a later module that needs
# them as its reference (the CPU soak), which then starts no server of its own (about 45 s on
# 2 cores). Recorded right after the start, before any other request: a fresh server, as the
# reader's own would be.
_FRESH_TEXTS: dict[tuple, list[str]] = {}


def record_fresh_texts(server) -> None:
    _FRESH_TEXTS[server.config_key] = texts_of_pinned(server)


def recorded_fresh_texts(server) -> list[str] | None:
    """The texts recorded from a fresh server configured as ``server`` (not started), or None."""
    return _FRESH_TEXTS.get(server.config_key)


def complete(server, body: dict) -> dict:
    with httpx.Client(timeout=120, trust_env=False) as client:
        resp = client.post(server.base_url + "/v1/completions", content=json.dumps(body),
                           headers={"Content-Type": "application/json"})
    assert resp.status_code == 200, resp.text
    return resp.json()


def assert_serving(server) -> None:
    answer = complete(server, greedy_completion(server.model, "The capital of France is", 8))
    assert "Paris" in answer["choices"][0]["text"]
    with httpx.Client(timeout=10, trust_env=False) as client:
        assert client.get(server.base_url + "/health").status_code == 200


def wait_idle(server, timeout_s: float = 30.0) -> dict:
    """Metrics once no request runs or waits (the gauges trail the last answer by a step)."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = metric_totals(server.base_url)
        idle = (metrics["vllm:num_requests_running"] == 0
                and metrics["vllm:num_requests_waiting"] == 0)
        if idle or time.monotonic() > deadline:
            return metrics
        time.sleep(0.5)


def soak(server, texts_without_speculation: list[str], requests: int, concurrency: int,
         deadline_s: float, max_model_len: int, seed: int = 15) -> dict:
    pinned = pinned_requests(server.model)
    alone = [run_load(server.base_url, [req], concurrency=1, deadline_s=60)[0]
             for req in pinned]
    assert problems(pinned, alone) == []
    bad = [LoadRequest("bad:" + b.name, b.path, b.body, expect_status=b.status)
           for b in bad_requests(server.model, max_model_len)
           if b.body is not None and b.name in BAD_IN_LOAD]
    mix = build_mix(server.model, requests, seed=seed, pinned=pinned, scattered=bad)
    before = metric_totals(server.base_url)

    start = time.monotonic()
    results = run_load(server.base_url, mix, concurrency, deadline_s)
    wall = time.monotonic() - start

    found = problems(mix, results)
    assert found == [], f"{len(found)} bad results in {wall:.0f} s:\n" + "\n".join(found[:30])
    kinds = {req.kind for req in mix}
    assert {"json", "n2", "logprobs", "stop", "penalties", "chat", "chat_stream"} <= kinds
    hung_up = sum(res.cancelled for res in results)
    assert 0.05 * requests <= hung_up <= 0.15 * requests
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
    after = wait_idle(server)
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
    drafts = (after["vllm:spec_decode_num_drafts_total"]
              - before["vllm:spec_decode_num_drafts_total"])
    accepted = (after["vllm:spec_decode_num_accepted_tokens_total"]
                - before["vllm:spec_decode_num_accepted_tokens_total"])
    assert after["vllm:spec_decode_num_draft_tokens_total"] > \
        before["vllm:spec_decode_num_draft_tokens_total"], "speculation did not run"
    assert accepted > 0
    assert_serving(server)
    return {"requests": len(mix), "concurrency": concurrency, "wall_s": round(wall, 1),
            "hung_up": hung_up, "generated_tokens": int(generated),
            "delivered_tokens": int(delivered), "drafts": int(drafts),
            "accepted_tokens": int(accepted),
            "acceptance_length": 1 + accepted / drafts if drafts else None}
