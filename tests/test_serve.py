"""A real ``vllm serve`` subprocess on our platform (CPU, SmolLM2-135M-Instruct fp32), driven
through the ``openai`` client: completions and chat, streamed and not, usage counts, Prometheus
metrics, bad requests, concurrency, a clean shutdown on SIGTERM, and servers with n-gram
speculative decoding and with the README's EAGLE-3 command.

One server serves the whole module (start costs about a minute on 2 cores); the shutdown test
stops it, so it comes after every test that sends requests to it.
"""
from __future__ import annotations

import contextlib
import json
import re
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.prompts import PROMPTS
from tests.serve_utils import VllmServer, metric_totals, port_is_listening

pytestmark = pytest.mark.slow

openai = pytest.importorskip("openai")

STARTUP_TIMEOUT_S = 300
SHUTDOWN_TIMEOUT_S = 60
CAPITAL_PROMPT = "The capital of France is"
CAPITAL_QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
NGRAM_SPEC_CONFIG = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}


def _client(server: VllmServer):
    # No retries: a retried request would hide a failed one and skew the metric counts.
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=180,
                         max_retries=0)


def _greedy(max_tokens: int, **extra_body) -> dict:
    return {"temperature": 0.0, "max_tokens": max_tokens, "extra_body": extra_body or None}


def _assert_greedy_equals_hf(client, server: VllmServer, model_path, prompt: str,
                             max_tokens: int) -> str:
    """One greedy completion (EOS ignored) whose token ids must equal transformers' greedy ones;
    returns its text."""
    from tests.hf_reference import hf_greedy_token_ids, tokenize

    resp = client.completions.create(model=server.model, prompt=prompt,
                                     **_greedy(max_tokens, ignore_eos=True, return_token_ids=True))
    assert resp.choices[0].token_ids == hf_greedy_token_ids(
        model_path, tokenize(model_path, prompt), max_tokens), prompt
    return resp.choices[0].text


def _assert_stopped_cleanly(server: VllmServer) -> None:
    code = server.stop(timeout_s=SHUTDOWN_TIMEOUT_S, sig=signal.SIGTERM)
    assert code == 0, (f"vllm serve exit code {code} after SIGTERM (None: still running after "
                       f"{SHUTDOWN_TIMEOUT_S} s, killed); log tail:\n{server.log_tail()}")
    assert not port_is_listening(server.port), f"something still listens on port {server.port}"
    # The engine core is a child in the server's process group; give it a moment to be reaped.
    deadline = time.monotonic() + 10
    while server.children_alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert server.children_alive() == [], "server children outlived it"


def _launch_server(tmp_path_factory, name: str, extra_args=(), env=None) -> VllmServer:
    """Started, not yet waited for (`_ready`)."""
    from specdec_plugin.models import fetch_smollm2

    log = tmp_path_factory.mktemp(name) / "server.log"
    return VllmServer(str(fetch_smollm2()), extra_args, log_path=log, env=env).start()


def _ready(server: VllmServer) -> VllmServer:
    try:
        server.wait_ready(STARTUP_TIMEOUT_S)
    except BaseException:
        server.kill()
        raise
    return server


def _start_server(tmp_path_factory, name: str, extra_args=(), env=None) -> VllmServer:
    return _ready(_launch_server(tmp_path_factory, name, extra_args, env))


def _selected(request, test_name: str) -> bool:
    return any(getattr(item, "originalname", item.name) == test_name
               and item.module is request.module for item in request.session.items)


@pytest.fixture(scope="module")
def server(tmp_path_factory, request):
    # The README's EAGLE-3 server starts next to this one (it is not adaptive, so nothing it
    # measures depends on how busy the cores are): on 2 cores much of one start overlaps the
    # other's. Both are up before the tests below send their first request.
    readme = None
    if _selected(request, "test_readme_eagle3_server_answers_greedily"):
        readme = request.getfixturevalue("readme_eagle3_server")
    srv = _start_server(tmp_path_factory, "serve")
    if readme is not None:
        # A failure to start is reported by the README test (its `_ready` raises again).
        with contextlib.suppress(Exception):
            _ready(readme)
    if any("texts_without_speculation" in getattr(item, "fixturenames", ())
           for item in request.session.items):
        # The CPU soak's reference, from this fresh server (its arguments are the soak's plain
        # server's): test_serve_under_load.py then starts no server for it (serve_soak.py).
        # A failure here records nothing: that module then starts its own and reports it.
        from tests.serve_soak import record_fresh_texts

        with contextlib.suppress(Exception):
            record_fresh_texts(srv)
    yield srv
    # Normally test_sigterm_shuts_down_cleanly has stopped it already; if that test was not
    # selected, the clean-shutdown check still runs here.
    if srv.process.poll() is None:
        _assert_stopped_cleanly(srv)


@pytest.fixture(scope="module")
def client(server):
    return _client(server)


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


def _metric_totals(server: VllmServer) -> dict[str, float]:
    return metric_totals(server.base_url)


def _draft_length_counts(server: VllmServer) -> dict[int, float]:
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    counts: dict[int, float] = {}
    for match in re.finditer(r'^vllm:spec_decode_draft_length_total\{[^}]*length="(\d+)"[^}]*\}\s+(\S+)',
                             text, re.M):
        counts[int(match.group(1))] = counts.get(int(match.group(1)), 0.0) + float(match.group(2))
    return counts


# --- answers ----------------------------------------------------------------------------------

def test_completion_is_greedy_and_right(client, server, smollm2_path):
    from tests.hf_reference import hf_greedy_token_ids, tokenize

    resp = client.completions.create(model=server.model, prompt=CAPITAL_PROMPT,
                                     **_greedy(16, ignore_eos=True, return_token_ids=True))
    choice = resp.choices[0]
    assert "Paris" in choice.text
    assert choice.finish_reason == "length"
    # Token for token what transformers' greedy search produces.
    prompt_ids = tokenize(smollm2_path, CAPITAL_PROMPT)
    assert choice.prompt_token_ids == prompt_ids
    assert choice.token_ids == hf_greedy_token_ids(smollm2_path, prompt_ids, 16)


def test_chat_completion_answers(client, server):
    resp = client.chat.completions.create(model=server.model, messages=CAPITAL_QUESTION,
                                          **_greedy(32))
    message = resp.choices[0].message
    assert message.role == "assistant"
    assert "Paris" in message.content


def test_completion_usage_counts(client, server, tokenizer):
    resp = client.completions.create(model=server.model, prompt=PROMPTS[2],
                                     **_greedy(20, ignore_eos=True, return_token_ids=True))
    usage = resp.usage
    assert usage.prompt_tokens == len(tokenizer(PROMPTS[2]).input_ids)
    assert usage.completion_tokens == 20 == len(resp.choices[0].token_ids)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_chat_usage_counts(client, server, tokenizer):
    resp = client.chat.completions.create(model=server.model, messages=CAPITAL_QUESTION,
                                          **_greedy(32))
    templated = tokenizer.apply_chat_template(CAPITAL_QUESTION, add_generation_prompt=True,
                                              tokenize=True)
    if not isinstance(templated, list):  # transformers 5 returns a BatchEncoding
        templated = templated["input_ids"]
    usage = resp.usage
    assert usage.prompt_tokens == len(templated)
    # The answer stops at EOS (finish "stop"): the EOS token counts, the text does not hold it.
    assert resp.choices[0].finish_reason == "stop"
    answer_ids = tokenizer(resp.choices[0].message.content, add_special_tokens=False).input_ids
    assert usage.completion_tokens == len(answer_ids) + 1
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


# --- streaming --------------------------------------------------------------------------------

def test_streamed_completion_equals_unstreamed(client, server):
    kwargs = dict(model=server.model, prompt=PROMPTS[1], **_greedy(32, ignore_eos=True))
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True},
                                            **kwargs))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1, "not streamed"
    assert streamed == whole.choices[0].text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()


def test_streamed_chat_equals_unstreamed(client, server):
    kwargs = dict(model=server.model, messages=CAPITAL_QUESTION, **_greedy(32))
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True,
                                                 stream_options={"include_usage": True}, **kwargs))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in streamed
    assert streamed == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()


# --- metrics ----------------------------------------------------------------------------------

def test_metrics_count_tokens_and_requests(client, server):
    before = _metric_totals(server)
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:request_success_total"):
        assert name in before, f"{name} missing from /metrics"
    resp = client.completions.create(model=server.model, prompt=PROMPTS[4],
                                     **_greedy(12, ignore_eos=True))
    want = {
        "vllm:prompt_tokens_total": before["vllm:prompt_tokens_total"] + resp.usage.prompt_tokens,
        "vllm:generation_tokens_total":
            before["vllm:generation_tokens_total"] + resp.usage.completion_tokens,
        "vllm:request_success_total": before["vllm:request_success_total"] + 1,
    }
    # The stat loggers may record the step just after the response went out: poll briefly.
    deadline = time.monotonic() + 15
    while True:
        after = _metric_totals(server)
        got = {name: after[name] for name in want}
        if got == want or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert got == want


# --- bad requests -----------------------------------------------------------------------------

@pytest.mark.parametrize("bad, error", [
    ({"max_tokens": 5000}, "BadRequestError"),          # more than max_model_len=1024
    ({"temperature": -1.0}, "BadRequestError"),
    ({"model": "no-such-model"}, "NotFoundError"),
    ({"extra_body": {"top_k": -7}}, "BadRequestError"),
])
def test_bad_request_gets_4xx_and_server_keeps_serving(client, server, bad, error):
    kwargs = {"model": server.model, "prompt": CAPITAL_PROMPT, **_greedy(8), **bad}
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(**kwargs)
    assert 400 <= info.value.status_code < 500
    assert type(info.value).__name__ == error
    good = client.completions.create(model=server.model, prompt=CAPITAL_PROMPT, **_greedy(8))
    assert "Paris" in good.choices[0].text
    assert urllib.request.urlopen(server.base_url + "/health", timeout=10).status == 200


# --- concurrency ------------------------------------------------------------------------------

def test_concurrent_requests_all_succeed(client, server):
    max_tokens = 16

    def complete(prompt: str):
        return client.completions.create(model=server.model, prompt=prompt,
                                         **_greedy(max_tokens, ignore_eos=True))

    # Answers one at a time first: batching the same greedy requests must not change them.
    sequential = [complete(p).choices[0].text for p in PROMPTS]
    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        results = list(pool.map(complete, PROMPTS))
    for resp in results:
        assert resp.choices[0].finish_reason == "length"
        assert resp.usage.completion_tokens == max_tokens
    assert [r.choices[0].text for r in results] == sequential
    assert "Paris" in results[0].choices[0].text


# --- shutdown (keep after every test above that uses `server`) --------------------------------

def test_sigterm_shuts_down_cleanly(server):
    assert server.process.poll() is None, "server died during the tests:\n" + server.log_tail()
    _assert_stopped_cleanly(server)


# --- speculative decoding ---------------------------------------------------------------------

def test_ngram_speculative_server_answers_greedily(tmp_path_factory, smollm2_path):
    # With the adaptive draft-length controller, as users get it by default.
    srv = _start_server(tmp_path_factory, "serve_ngram",
                        ["--speculative-config", json.dumps(NGRAM_SPEC_CONFIG)],
                        env={"SPECDEC_ADAPTIVE": "1"})
    try:
        client = _client(srv)
        assert "Paris" in _assert_greedy_equals_hf(client, srv, smollm2_path, CAPITAL_PROMPT, 16)
        # A prompt that repeats itself gives the n-gram proposer something to draft; speculative
        # decoding must not change the greedy answer.
        looping = PROMPTS[6] + " jumps over the lazy dog. " * 6 + PROMPTS[6]
        _assert_greedy_equals_hf(client, srv, smollm2_path, looping, 24)
        metrics = _metric_totals(srv)
        assert metrics.get("vllm:spec_decode_num_draft_tokens_total", 0) > 0, \
            "no draft tokens proposed: speculative decoding did not run"
        assert metrics.get("vllm:spec_decode_num_accepted_tokens_total", 0) > 0
        # The chosen draft lengths: every verified draft is counted under its length, and the
        # steps without one under length 0.
        lengths = _draft_length_counts(srv)
        assert sum(c for length, c in lengths.items() if length > 0) == \
            metrics["vllm:spec_decode_num_drafts_total"], lengths
        assert lengths.get(0, 0) > 0, lengths
        assert "adaptive drafting on" in srv.log_tail(100000)
    finally:
        if srv.process.poll() is None:
            _assert_stopped_cleanly(srv)


def _readme_speculative_config(drafter_path: str) -> dict:
    """The speculative config of the README's serve command, the drafter's path filled in
    where the command asks `specdec-models drafter eagle3` for it."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    line = next(l for l in readme.splitlines() if 'vllm serve "$(specdec-models fetch smollm2-135m)"' in l)
    quoted = line.split("--speculative-config '", 1)[1].rsplit("'", 1)[0]
    return json.loads(quoted.replace("'\"$(specdec-models drafter eagle3)\"'", drafter_path))


def _readme_eagle3_config() -> dict:
    from specdec_plugin.models.drafters import drafter_checkpoint

    return _readme_speculative_config(str(drafter_checkpoint("eagle3")))


@pytest.fixture(scope="module")
def readme_eagle3_server(tmp_path_factory):
    """The README's serve command, started (not waited for): the plain server's fixture
    starts it next to its own."""
    srv = _launch_server(tmp_path_factory, "serve_eagle3",
                         ["--max-model-len", "2048", "--speculative-config",
                          json.dumps(_readme_eagle3_config())])
    yield srv
    srv.kill()  # normally its test has stopped it cleanly


def test_readme_eagle3_server_answers_greedily(readme_eagle3_server, smollm2_path):
    """The README's main command: `vllm serve` SmolLM2 with the shipped EAGLE-3 drafter."""
    config = _readme_eagle3_config()
    assert config["method"] == "eagle3" and config["num_speculative_tokens"] >= 1, config
    srv = _ready(readme_eagle3_server)
    try:
        client = _client(srv)
        for prompt in (CAPITAL_PROMPT, "def fibonacci(n):"):
            _assert_greedy_equals_hf(client, srv, smollm2_path, prompt, 24)
        metrics = _metric_totals(srv)
        assert metrics.get("vllm:spec_decode_num_accepted_tokens_total", 0) > 0, metrics
    finally:
        if srv.process.poll() is None:
            _assert_stopped_cleanly(srv)
