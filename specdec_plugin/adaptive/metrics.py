"""The draft lengths the controller chose, as a Prometheus counter next to vLLM's own
``vllm:spec_decode_*`` metrics: ``vllm:spec_decode_draft_length_total{length="L"}`` counts
request-steps that verified a draft of exactly L tokens (0: a plain step, no draft).

Installed through vLLM's stat-logger plugin hook (entry point group
``vllm.stat_logger_plugins``), so it runs in the API server process that serves ``/metrics``.
It derives the lengths from what vLLM already sends there, so nothing new crosses processes:

- drafts of at least L tokens = ``num_draft_tokens_per_pos[L-1]`` of the step's spec stats;
- request-steps without a draft = generated tokens - accepted tokens - drafts (each
  request-step yields exactly one token that was not an accepted draft token).
"""
from __future__ import annotations

import prometheus_client
from vllm.v1.metrics.loggers import StatLoggerBase

NAME = "vllm:spec_decode_draft_length"
_counter = None


def _draft_length_counter():
    """The counter, registered in the default registry. vLLM's Prometheus logger, created
    after the plugin loggers, unregisters every ``vllm:`` collector when it starts (one per
    engine), so this runs at the first record, not at construction."""
    global _counter
    if _counter is None:
        _counter = prometheus_client.Counter(
            NAME, "Request-steps by the length of the draft they verified (0: no draft).",
            labelnames=["model_name", "engine", "length"], registry=None)
    try:
        prometheus_client.REGISTRY.register(_counter)
    except ValueError:  # already registered
        pass
    return _counter


def draft_length_counts(num_draft_tokens_per_pos: list[int], num_drafts: int,
                        num_accepted: int, num_generation_tokens: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    per_pos = list(num_draft_tokens_per_pos) + [0]
    for length in range(1, len(per_pos)):
        exactly = per_pos[length - 1] - per_pos[length]
        if exactly > 0:
            counts[length] = exactly
    plain = num_generation_tokens - num_accepted - num_drafts
    if plain > 0:
        counts[0] = plain
    return counts


class DraftLengthStatLogger(StatLoggerBase):
    def __init__(self, vllm_config, engine_index: int = 0):
        self.enabled = vllm_config.speculative_config is not None
        self.labels = (vllm_config.model_config.served_model_name, str(engine_index))
        self.counter = None

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        if not self.enabled or iteration_stats is None:
            return
        spec = scheduler_stats.spec_decoding_stats if scheduler_stats is not None else None
        counts = draft_length_counts(
            spec.num_draft_tokens_per_pos if spec else [], spec.num_drafts if spec else 0,
            spec.num_accepted_tokens if spec else 0, iteration_stats.num_generation_tokens)
        if self.counter is None:
            self.counter = _draft_length_counter()
        for length, count in counts.items():
            self.counter.labels(*self.labels, str(length)).inc(count)

    def log_engine_initialized(self):
        pass
