"""Bad requests to a ``vllm serve`` with speculative decoding on, and what each must get back:
a 4xx status and a message that names the problem.

``bad_requests(model, max_model_len) -> list[BadRequest]``; ``BadRequest.raw`` is the exact
request body (bytes), so malformed JSON can be sent too.

Every refusal below is vLLM's own (request validation in its OpenAI front end and
``SamplingParams``); none reaches our plugin's model runner. The two speculative-decoding
refusals (``min_p``, ``logit_bias``) are vLLM's as well. vLLM has no request-level speculative
field: unknown fields such as ``num_speculative_tokens`` are accepted and ignored (vLLM logs
them at debug level only); tests/test_serve_under_load.py checks that they change nothing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
# SmolLM2's vocabulary has 49,152 tokens.
OUT_OF_VOCAB_ID = 10**7
TWO_MB = 2 * 1024 * 1024


@dataclass(frozen=True)
class BadRequest:
    name: str
    path: str
    raw: bytes
    status: int
    message: str  # a regular expression the error message must match

    @property
    def body(self) -> dict | None:
        try:
            return json.loads(self.raw)
        except ValueError:
            return None


def bad_requests(model: str, max_model_len: int) -> list[BadRequest]:
    base = {"model": model, "prompt": "The capital of France is", "max_tokens": 8}
    chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}

    def case(name, body, status, message, path=COMPLETIONS):
        return BadRequest(name, path, json.dumps(body).encode(), status, message)

    return [
        BadRequest("malformed_json", COMPLETIONS, b'{"model": "x", "prompt": ', 400,
                   "JSON decode error"),
        case("unknown_model", {**base, "model": "no-such-model"}, 404,
             "model `no-such-model` does not exist"),
        case("max_tokens_negative", {**base, "max_tokens": -1}, 400,
             "max_tokens must be at least 1, got -1"),
        case("max_tokens_huge", {**base, "max_tokens": 10**9}, 400,
             f"max_tokens=1000000000 cannot be greater than max_model_len.*{max_model_len}"),
        case("chat_max_tokens_huge", {**chat, "max_tokens": 10**9}, 400,
             "cannot be greater than max_model_len", CHAT),
        case("temperature_negative", {**base, "temperature": -1}, 400,
             "temperature must be non-negative"),
        case("top_p_2", {**base, "top_p": 2}, 400, r"top_p must be in \(0, 1\], got 2"),
        case("chat_stream_top_p_2", {**chat, "top_p": 2, "stream": True}, 400,
             r"top_p must be in \(0, 1\]", CHAT),
        case("prompt_over_max_model_len", {**base, "prompt": "hello " * (max_model_len + 50)},
             400, f"maximum context length is {max_model_len} tokens"),
        case("logprobs_1000", {**base, "logprobs": 1000}, 400,
             "logprobs of 1000, which is greater than max allowed"),
        case("prompt_logprobs_1000", {**base, "prompt_logprobs": 1000}, 400,
             "prompt logprobs of 1000, which is greater than max allowed"),
        case("n_0", {**base, "n": 0}, 400, "n must be at least 1, got 0"),
        case("empty_prompt", {**base, "prompt": ""}, 400, "must be provided and non-empty"),
        case("empty_token_list", {**base, "prompt": []}, 400, "at least one prompt"),
        case("empty_chat", {**chat, "messages": []}, 400, "empty conversation", CHAT),
        case("out_of_vocab_token_id", {**base, "prompt": [1, 2, OUT_OF_VOCAB_ID]}, 400,
             f"Token id {OUT_OF_VOCAB_ID} is out of vocabulary"),
        case("negative_token_id", {**base, "prompt": [1, 2, -5]}, 400,
             "greater than or equal to 0"),
        # The front end refuses it by character count, before tokenizing 2 MB.
        case("prompt_2mb", {**base, "prompt": "a " * (TWO_MB // 2)}, 400,
             "maximum context length"),
        case("max_tokens_not_int", {**base, "max_tokens": 1.5}, 400, "valid integer"),
        case("bad_json_schema", {**chat, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
             400, "Grammar error", CHAT),
        case("bad_regex", {**base, "structured_outputs": {"regex": "(("}}, 400,
             "invalid regex"),
        # Refused because speculative decoding is on (vLLM's SamplingParams._validate_spec_decode).
        case("min_p_with_speculation", {**base, "min_p": 0.1}, 400,
             "not yet supported with speculative decoding"),
        case("logit_bias_with_speculation", {**base, "logit_bias": {"42": 5}}, 400,
             "not yet supported with speculative decoding"),
    ]
