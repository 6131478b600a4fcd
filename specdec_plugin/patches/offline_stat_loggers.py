"""P15: our draft-length counter in offline engines too (see the catalog).

vLLM loads the ``vllm.stat_logger_plugins`` entry points only in ``AsyncLLM`` (``vllm serve``),
not in ``LLMEngine``, which ``LLM(...)`` builds. So ``vllm:spec_decode_draft_length`` (the
lengths the adaptive controller chose, adaptive/metrics.py) is on a server's /metrics but not
in ``LLM.get_metrics()``. This wraps ``LLMEngine.__init__`` to add our stat logger to the
``stat_loggers`` it is given. It records only where speculative decoding is configured.
"""
from __future__ import annotations

import functools
import inspect


def with_draft_length_logger(stat_loggers):
    """``stat_loggers`` (a list of factories, or None) with ours added once."""
    from specdec_plugin.adaptive.metrics import DraftLengthStatLogger

    loggers = list(stat_loggers or [])
    if DraftLengthStatLogger not in loggers:
        loggers.append(DraftLengthStatLogger)
    return loggers


def apply() -> None:
    from vllm.v1.engine.llm_engine import LLMEngine

    original = LLMEngine.__init__
    if getattr(original, "_specdec_draft_length", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.arguments["stat_loggers"] = with_draft_length_logger(
            bound.arguments.get("stat_loggers"))
        original(*bound.args, **bound.kwargs)

    __init__._specdec_draft_length = True
    LLMEngine.__init__ = __init__
