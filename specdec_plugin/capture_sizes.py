"""Graph capture sizes for speculative decoding: every size a multiple of 1+K.

A decode step with K speculative tokens feeds every request 1+K query tokens, so a uniform
decode batch of n requests has n*(1+K) tokens. vLLM's default sizes (1, 2, 4, 8, 16, ...) are
made for plain decode; with speculation only their multiples of 1+K can hold a full decode
graph, and vLLM rounds them up silently inside the worker. We choose the sizes up front instead:

- no sizes given: n*(1+K) for n = 1, 2, 4, then every 8 requests up to 256, then every 32,
  up to ``max_num_seqs`` requests (at most ``max_num_batched_tokens`` tokens; the largest
  batch that fits is always among them);
- sizes given by the user: each rounded up to the next multiple of 1+K, with a warning that
  names the sizes before and after.

The user's list is only visible in process 0, while ``EngineArgs.create_engine_config`` runs
(patch P6 records it here); a worker that rebuilds the config finds sizes that are already
multiples and changes nothing.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import TYPE_CHECKING

from specdec_plugin.log import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

_NOT_RECORDED = object()
# What the user passed as compilation_config.cudagraph_capture_sizes (None: nothing).
_user_sizes: contextvars.ContextVar = contextvars.ContextVar("specdec_user_capture_sizes",
                                                             default=_NOT_RECORDED)


@contextlib.contextmanager
def recording_user_sizes(sizes: list[int] | None):
    token = _user_sizes.set(None if sizes is None else list(sizes))
    try:
        yield
    finally:
        _user_sizes.reset(token)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def spec_decode_capture_sizes(query_len: int, max_num_seqs: int, max_num_tokens: int) -> list[int]:
    """The sizes we choose: n*(1+K) for a spread of request counts n."""
    counts = [1, 2, 4] + list(range(8, min(max_num_seqs, 256) + 1, 8))
    counts += list(range(288, max_num_seqs + 1, 32))
    # The largest uniform decode batch that fits the token budget always has its graph.
    counts.append(min(max_num_seqs, max_num_tokens // query_len))
    sizes = sorted({n * query_len for n in counts if 0 < n <= max_num_seqs})
    return [s for s in sizes if s <= max_num_tokens] or [query_len]


def round_user_sizes(sizes: list[int], query_len: int, max_num_tokens: int) -> list[int]:
    rounded = sorted({_round_up(s, query_len) for s in sizes if s > 0})
    kept = [s for s in rounded if s <= max_num_tokens]
    return kept or [query_len]


def apply_capture_sizes(config: "VllmConfig") -> None:
    """Rewrite the capture sizes in ``config`` for spec decode (no-op without graphs or spec)."""
    from vllm.config.compilation import CUDAGraphMode

    compilation = config.compilation_config
    spec = config.speculative_config
    if (spec is None or not spec.num_speculative_tokens
            or compilation.cudagraph_mode == CUDAGraphMode.NONE
            or not compilation.cudagraph_capture_sizes):
        return
    query_len = 1 + spec.num_speculative_tokens
    scheduler = config.scheduler_config
    max_num_tokens = scheduler.max_num_batched_tokens
    current = list(compilation.cudagraph_capture_sizes)
    user = _user_sizes.get()
    if user is _NOT_RECORDED:  # a worker: sizes were chosen in process 0
        sizes = round_user_sizes(current, query_len, max_num_tokens)
    elif user is None:
        sizes = spec_decode_capture_sizes(query_len, scheduler.max_num_seqs, max_num_tokens)
        logger.info("specdec_plugin: graph capture sizes n*(1+K) for K=%d: %s",
                    query_len - 1, sizes)
    else:
        sizes = round_user_sizes(user, query_len, max_num_tokens)
        if sizes != sorted(set(user)):
            logger.warning(
                "specdec_plugin: compilation_config.cudagraph_capture_sizes=%s changed to %s: "
                "with num_speculative_tokens=%d a decode batch has a multiple of %d tokens, so "
                "each size was rounded up to one (sizes above max_num_batched_tokens=%d dropped).",
                sorted(set(user)), sizes, query_len - 1, query_len, max_num_tokens,
            )
    if sizes == current:
        return
    compilation.cudagraph_capture_sizes = sizes
    compilation.max_cudagraph_capture_size = sizes[-1]
    compilation.post_init_cudagraph_sizes()
