"""Loggers for the plugin's modules that print through vLLM's handlers.

vLLM configures only its own ``vllm`` logger. A logger named ``specdec_plugin.*`` therefore
reaches only Python's last-resort handler, which drops INFO: a user would not see, for example,
which capture sizes we chose. ``init_logger`` gives our package logger vLLM's handlers and
level, once. It keeps propagating, so pytest's ``caplog`` and a user's root handlers see our
records as well.
"""
from __future__ import annotations

import logging

from vllm.logger import init_logger as _vllm_init_logger


def init_logger(name: str) -> logging.Logger:
    package = logging.getLogger("specdec_plugin")
    if not package.handlers:
        vllm_logger = logging.getLogger("vllm")
        for handler in vllm_logger.handlers:
            package.addHandler(handler)
        if vllm_logger.handlers:
            package.setLevel(vllm_logger.level)
    return _vllm_init_logger(name)
