"""Distinct ``VLLM_PORT`` values for engine processes that one parent starts at the same time.

Every vLLM engine, even on one device, opens a TCP rendezvous (``torch.distributed``'s TCPStore)
on the port ``vllm.utils.network_utils.get_open_port`` picks. Without ``VLLM_PORT`` that is a
port the kernel hands out for ``bind(0)`` and that vLLM closes again before the store listens on
it, so two engines starting at once can be given the same one: the second dies with
``EADDRINUSE``. CI lost a run to it (training/eval_acceptance.py's two engines at once, session
46's submission). With ``VLLM_PORT`` set, vLLM tries that port and the ones after it instead.

``engine_port_env()`` gives each engine a start of its own, 20 ports apart, below Linux's
ephemeral range (32768-60999) so that no ``bind(0)`` in another process lands on it, and
spread by the parent's pid so that two parents are unlikely to share starts. A port still taken
is skipped by vLLM's own search.
"""
from __future__ import annotations

import itertools
import os
import threading

FIRST_PORT = 20000  # below the ephemeral range that bind(0) draws from
PORTS_PER_ENGINE = 20  # tensor/pipeline-parallel engines use a few ports each
SLOTS = 600  # FIRST_PORT + SLOTS * PORTS_PER_ENGINE = 32000, still below 32768

_lock = threading.Lock()
_counter = itertools.count()


def next_engine_port() -> int:
    """A ``VLLM_PORT`` no other engine this process starts will be given (for 600 engines)."""
    with _lock:
        index = next(_counter)
    slot = (os.getpid() * 37 + index) % SLOTS
    return FIRST_PORT + slot * PORTS_PER_ENGINE


def engine_port_env() -> dict[str, str]:
    """Environment entries to add to one engine subprocess's environment."""
    return {"VLLM_PORT": str(next_engine_port())}
