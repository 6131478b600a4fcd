"""Concurrent traffic against a ``vllm serve`` on loopback, for the soak and fault tests.

- ``LoadRequest``: one request of the mix (endpoint, JSON body, streamed or not, and after how
  many streamed chunks the client hangs up, if it does).
- ``build_mix(model, count, seed, pinned=(), scattered=())`` -> a deterministic list of
  requests that mixes greedy, temperature/top-p/top-k, n=2, logprobs, stop strings, penalties,
  streamed and non-streamed chat, JSON-schema structured outputs and clients that hang up
  mid-stream; ``pinned`` requests are spliced into the middle of the list, ``scattered`` ones
  (bad requests, say) spread evenly over it.
- ``run_load(base_url, requests, concurrency, deadline_s) -> list[LoadResult]``: sends them with
  at most ``concurrency`` in flight, each on a fresh connection (``_run`` says why); every
  request is bounded in time and the whole run by ``deadline_s``.
- ``problems(requests, results) -> list[str]``: what is wrong with any request that was not
  cancelled (no text, no finish reason, a bad status, a structured output that is not JSON of
  the schema, logprobs that do not match the tokens).
- ``greedy_completion(model, prompt, max_tokens)``: the body of the fixed greedy requests whose
  text must not depend on the load around them.

Only the standard library and httpx (a dependency of the openai client) are used, with one
asyncio loop: 32 client threads would compete with the server for the 2 cores of CI.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import httpx

# A schema small enough for a 135M model to fill within a few tokens; the grammar forces it.
JSON_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "rank": {"type": "integer"}},
    "required": ["city", "rank"],
    "additionalProperties": False,
}
TOPICS = ("the sea", "a red fox", "Paris", "prime numbers", "a small village", "the moon",
          "coffee", "a robot", "autumn leaves", "a train station")
CHAT_QUESTIONS = ("What is the capital of France?", "Name a primary color.",
                  "Say hello to a friend.", "What is 2 + 2?", "Describe the sea in one line.")
# Small on purpose: the whole soak must fit in a few minutes on 2 cores.
MAX_TOKENS = 12
REQUEST_TIMEOUT_S = 120.0


@dataclass
class LoadRequest:
    kind: str
    path: str  # "/v1/completions" or "/v1/chat/completions"
    body: dict
    stream: bool = False
    hang_up_after: int | None = None  # streamed chunks read before the client closes
    expect_status: int = 200  # a bad request mixed into the load expects its 4xx


@dataclass
class LoadResult:
    status: int | None = None
    texts: list[str] = field(default_factory=list)  # one per choice, by index
    finish_reasons: list[str | None] = field(default_factory=list)
    body: dict | None = None  # the JSON answer of a non-streamed request
    cancelled: bool = False
    saw_done: bool = False  # the stream ended with "data: [DONE]"
    completion_tokens: int | None = None  # from the answer's usage
    error: str | None = None
    seconds: float = 0.0
    sent: bool = False
    done: bool = False  # the request ran to its end (answer, error or hang-up)


def greedy_completion(model: str, prompt: str, max_tokens: int = MAX_TOKENS) -> dict:
    # ignore_eos: every fixed prompt yields exactly max_tokens tokens, so a text that ends
    # early cannot hide a difference.
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True}


def _kinds(model: str, rng: random.Random) -> dict:
    topic = rng.choice(TOPICS)
    prompt = f"Write one sentence about {topic}."
    question = [{"role": "user", "content": rng.choice(CHAT_QUESTIONS)}]
    seed = rng.randrange(1 << 30)
    completion = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS}
    chat = {"model": model, "messages": question, "max_tokens": MAX_TOKENS}
    # min_tokens=1 keeps a sampled EOS from ending a request with no text at all.
    return {
        "greedy": ("/v1/completions", {**completion, "temperature": 0.0, "min_tokens": 1},
                   False),
        "sampled": ("/v1/completions", {**completion, "temperature": 0.8, "top_p": 0.9,
                                        "top_k": 40, "seed": seed, "min_tokens": 1}, False),
        "n2": ("/v1/completions", {**completion, "n": 2, "temperature": 1.0, "seed": seed,
                                   "min_tokens": 1}, False),
        "logprobs": ("/v1/completions", {**completion, "temperature": 0.0, "logprobs": 3,
                                         "min_tokens": 1}, False),
        # No "\n" among the stop strings: answers often begin with a newline, and a stop string
        # at the very start leaves no text (min_tokens does not hold stop strings back).
        "stop": ("/v1/completions", {**completion, "temperature": 0.0, "stop": [" is", "."],
                                     "min_tokens": 1,
                                     "prompt": f"Tell me about {topic} in a few words:"},
                 False),
        "penalties": ("/v1/completions", {**completion, "temperature": 0.7, "seed": seed,
                                          "presence_penalty": 0.5, "frequency_penalty": 0.5,
                                          "repetition_penalty": 1.2, "min_tokens": 1}, False),
        "chat": ("/v1/chat/completions", {**chat, "temperature": 0.0, "min_tokens": 1}, False),
        "chat_stream": ("/v1/chat/completions", {**chat, "temperature": 0.6, "seed": seed,
                                                 "min_tokens": 1}, True),
        "completion_stream": ("/v1/completions", {**completion, "temperature": 0.0,
                                                  "min_tokens": 1}, True),
        # More tokens: the grammar must be able to close the object.
        "json": ("/v1/chat/completions", {
            **chat, "max_tokens": 40, "temperature": 0.0,
            "messages": [{"role": "user",
                          "content": "Give a city and its rank as JSON."}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "city", "schema": JSON_SCHEMA}}},
                 False),
    }


# Share of each kind in the mix, out of 100; the rest of the traffic is hang-ups (10%).
WEIGHTS = {"greedy": 10, "sampled": 10, "n2": 8, "logprobs": 8, "stop": 8, "penalties": 8,
           "chat": 10, "chat_stream": 12, "completion_stream": 8, "json": 8}
HANG_UP_PERCENT = 10
HANG_UP_TOKENS = 64


def build_mix(model: str, count: int, seed: int = 0, pinned: list[LoadRequest] | tuple = (),
              scattered: list[LoadRequest] | tuple = ()) -> list[LoadRequest]:
    rng = random.Random(seed)
    names = list(WEIGHTS)
    weights = [WEIGHTS[name] for name in names]
    out: list[LoadRequest] = []
    for _ in range(count):
        if rng.randrange(100) < HANG_UP_PERCENT:
            # A client that reads a couple of chunks of a long answer and then closes the
            # connection: the server must abort the request and free its slots. ignore_eos:
            # left alone, it would run to HANG_UP_TOKENS, which tells an abort from none.
            path, body, _ = _kinds(model, rng)[rng.choice(["chat_stream", "completion_stream"])]
            out.append(LoadRequest("hang_up", path,
                                   {**body, "max_tokens": HANG_UP_TOKENS, "ignore_eos": True},
                                   stream=True, hang_up_after=rng.randrange(1, 4)))
            continue
        name = rng.choices(names, weights)[0]
        path, body, stream = _kinds(model, rng)[name]
        out.append(LoadRequest(name, path, body, stream=stream))
    for k, req in enumerate(scattered):
        out.insert((k + 1) * len(out) // (len(scattered) + 1), req)
    middle = len(out) // 2
    out[middle:middle] = list(pinned)
    return out


def _choice_text(choice: dict, chat: bool, streamed: bool) -> str:
    if not chat:
        return choice.get("text") or ""
    part = choice.get("delta" if streamed else "message") or {}
    return part.get("content") or ""


async def _send(client: httpx.AsyncClient, base_url: str, req: LoadRequest,
                result: LoadResult) -> None:
    start = time.monotonic()
    try:
        await _exchange(client, base_url, req, result)
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.seconds = time.monotonic() - start
    # Not reached when the run's deadline cancels the request.
    result.done = True


async def _exchange(client: httpx.AsyncClient, base_url: str, req: LoadRequest,
                    result: LoadResult) -> None:
    """Fills ``result`` as the answer arrives, so a request cut off by the run's deadline still
    shows what it had received."""
    chat = "chat" in req.path
    if not req.stream:
        resp = await client.post(base_url + req.path, json=req.body)
        result.status = resp.status_code
        if resp.status_code == 200:
            result.body = resp.json()
            result.completion_tokens = result.body["usage"]["completion_tokens"]
            for choice in sorted(result.body["choices"], key=lambda c: c["index"]):
                result.texts.append(_choice_text(choice, chat, False))
                result.finish_reasons.append(choice.get("finish_reason"))
        else:
            result.error = resp.text[:500]
        return
    texts: dict[int, str] = {}
    finishes: dict[int, str | None] = {}
    body = {**req.body, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", base_url + req.path, json=body) as resp:
        result.status = resp.status_code
        if resp.status_code != 200:
            result.error = (await resp.aread()).decode(errors="replace")[:500]
            return
        chunks = 0
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                result.saw_done = True
                break
            event = json.loads(data)
            if "error" in event:  # vLLM reports a failure mid-stream as an event
                result.error = f"stream error event: {data[:500]}"
            if event.get("usage"):
                result.completion_tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices", []):
                index = choice["index"]
                texts[index] = texts.get(index, "") + _choice_text(choice, chat, True)
                if choice.get("finish_reason"):
                    finishes[index] = choice["finish_reason"]
            result.texts = [texts[i] for i in sorted(texts)]
            result.finish_reasons = [finishes.get(i) for i in sorted(texts)]
            chunks += 1
            if req.hang_up_after is not None and chunks >= req.hang_up_after:
                # Leaving the `async with` closes the connection mid-stream.
                result.cancelled = True
                break


async def _run(base_url: str, requests: list[LoadRequest], concurrency: int,
               deadline_s: float) -> list[LoadResult]:
    results = [LoadResult() for _ in requests]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(requests)):
        queue.put_nowait(i)
    # A fresh connection per request (no keep-alive). At concurrency 512 the client's one event
    # loop falls seconds behind (httpcore's pool bookkeeping grows with the square of its
    # connections), uvicorn closes connections idle for its 5-s keep-alive meanwhile, and a
    # request written onto one just closed ends in httpx.ReadError with no status. Session 49
    # saw 3-6 such errors in 1536 requests on the GPU memory test and reproduced them against a
    # trivial FastAPI server (no vLLM): 0-5 per run with keep-alive, none without it, and the
    # client no longer lags. Those are the client's losses, not the server's.
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    # trust_env=False: no proxy from the environment may see loopback traffic.
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits,
                                 trust_env=False) as client:
        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                results[i].sent = True
                await _send(client, base_url, requests[i], results[i])

        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        try:
            await asyncio.wait_for(asyncio.gather(*workers), timeout=deadline_s)
        except asyncio.TimeoutError:
            # wait_for cancelled the workers, which closed their connections; a request cut
            # off keeps what it had received and is marked, so problems() reports it.
            for res in results:
                if not res.done:
                    res.error = res.error or ("cut off by the load deadline" if res.sent
                                              else "not sent: load deadline passed")
    return results


def run_load(base_url: str, requests: list[LoadRequest], concurrency: int = 32,
             deadline_s: float = 300.0) -> list[LoadResult]:
    assert base_url.startswith("http://127.0.0.1:"), "load goes to loopback only"
    return asyncio.run(_run(base_url, requests, concurrency, deadline_s))


def _json_problem(text: str) -> str | None:
    try:
        value = json.loads(text)
    except ValueError:
        return f"structured output is not JSON: {text!r}"
    if not isinstance(value, dict) or set(value) != {"city", "rank"}:
        return f"structured output does not follow the schema: {text!r}"
    if not isinstance(value["city"], str) or not isinstance(value["rank"], int):
        return f"structured output has wrong types: {text!r}"
    return None


def problems(requests: list[LoadRequest], results: list[LoadResult]) -> list[str]:
    out = []
    for i, (req, res) in enumerate(zip(requests, results)):
        where = f"request {i} ({req.kind})"
        if res.cancelled:
            continue
        if req.expect_status != 200:
            if res.status != req.expect_status:
                out.append(f"{where}: status {res.status}, want {req.expect_status}: "
                           f"{res.error}")
            continue
        if res.status != 200 or res.error:
            out.append(f"{where}: status {res.status}, {res.error}")
            continue
        want_choices = req.body.get("n", 1)
        if len(res.texts) != want_choices:
            out.append(f"{where}: {len(res.texts)} choices, want {want_choices}")
        if req.stream and not res.saw_done:
            out.append(f"{where}: stream ended without [DONE]")
        if res.completion_tokens is None:
            out.append(f"{where}: no usage in the answer")
        for text, finish in zip(res.texts, res.finish_reasons):
            if not text:
                out.append(f"{where}: empty text")
            if finish not in ("stop", "length"):
                out.append(f"{where}: finish_reason {finish!r}")
        if req.kind == "json" and res.texts:
            # The grammar must close the object well within max_tokens.
            problem = (_json_problem(res.texts[0]) if res.finish_reasons[0] == "stop"
                       else f"structured output cut off: {res.texts[0]!r}")
            if problem:
                out.append(f"{where}: {problem}")
        if req.kind == "logprobs" and res.body is not None:
            choice = res.body["choices"][0]
            tokens = choice["logprobs"]["tokens"]
            if len(tokens) != res.body["usage"]["completion_tokens"]:
                out.append(f"{where}: {len(tokens)} logprobs for "
                           f"{res.body['usage']['completion_tokens']} tokens")
            if any(len(top) > 3 + 1 for top in choice["logprobs"]["top_logprobs"]):
                out.append(f"{where}: more top logprobs than asked for")
    return out
