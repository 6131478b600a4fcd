"""Shared pytest setup.

- Tests marked ``gpu`` (marker declared in pyproject.toml) are skipped where no CUDA device is
  present.
- Without a CUDA device, Triton kernels run in Triton's interpreter: ``TRITON_INTERPRET=1`` is
  set here, at conftest import, because Triton decides interpreted-or-compiled when each
  ``@triton.jit`` function (its own ``tl.sum``/``tl.zeros`` helpers included) is decorated, so
  the variable must be in place before anything imports ``triton``. It does not change vLLM's
  ``HAS_TRITON`` (that looks for an active driver). An explicit ``TRITON_INTERPRET`` in the
  environment wins.
"""
from __future__ import annotations

import os
import sys

# OpenMP threads must not spin in the test process either (see specdec_plugin/device/cpu.py);
# the OpenMP runtime reads this when torch loads it, so it must precede `import torch`.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

# `python -m pytest` puts the repo root on sys.path, plain `pytest` does not.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    # Resolve vLLM's platform once, with the environment as the user has it, before any test
    # changes SPECDEC_* variables: vLLM caches the platform for the life of the process.
    try:
        from vllm.platforms import current_platform
    except ImportError:  # e.g. kernel tests on a GPU machine without vLLM
        return
    current_platform.device_type  # noqa: B018


def pytest_collection_modifyitems(config, items):
    # Markers follow what a test uses, so `-m "not slow and not model"` (README) really leaves
    # out every test that starts an engine or needs SmolLM2, however its module is marked.
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "smollm2_path" in fixtures:
            item.add_marker(pytest.mark.model)
        if "engines" in fixtures:
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ---------------------------------------------------------------------------------------------
# Real models and shared engines. Starting a vLLM engine costs tens of seconds on 2 cores, so
# engines are built once per configuration and shared by every test of the session.

# Adaptive drafting chooses draft lengths from step times measured at engine start, so its
# per-position acceptance counts vary from run to run: tests whose numbers must be exact run
# without it, and the tests of the controller ask for it (``EnginePool.get(adaptive=True)``).
os.environ.setdefault("SPECDEC_ADAPTIVE", "0")

# Small KV cache for tests: plenty for a few prompts, and quick to allocate.
os.environ.setdefault("SPECDEC_CPU_KV_CACHE_GIB", "0.25")


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from specdec_plugin.models import fetch_smollm2

    return str(fetch_smollm2())


# The session's engine pool, for the summary below.
_POOLS: list = []


def pytest_terminal_summary(terminalreporter):
    # How many engines the pool built and how long they took, and which configurations were
    # built more than once (pushed out of the pool, then asked for again): the first place
    # to look when CI's time grows.
    for pool in _POOLS:
        seconds = sum(s for _, s in pool.built)
        keys = [key for key, _ in pool.built]
        again = sorted({key for key in keys if keys.count(key) > 1})
        terminalreporter.write_line(f"engine pool: {len(keys)} engines built in {seconds:.0f} s, "
                                    f"{len(again)} configurations built more than once")
        for key in again:
            terminalreporter.write_line(f"  built {keys.count(key)}x: {key[:300]}")


@pytest.fixture(scope="session")
def engines(request):
    from tests.engine_pool import EnginePool

    pool = EnginePool()
    _POOLS.append(pool)
    # The plain baselines the selected modules declare (EnginePool.want_plain_greedy).
    modules = {id(item.module): item.module for item in request.session.items
               if getattr(item, "module", None) is not None}
    for module in modules.values():
        for prompts, max_tokens in getattr(module, "PLAIN_GREEDY_BASELINES", ()):
            pool.want_plain_greedy(prompts, max_tokens)
    yield pool
    pool.close()
