"""Loads the C++ extension ``specdec_plugin._C`` (built by setup.py from csrc/*.cpp).

When the installed package has no compiled ``_C`` (an editable checkout that was never built),
set ``SPECDEC_JIT_BUILD=1`` to compile csrc/ on first use with torch's cpp_extension.load; the
result is cached under torch's extension directory, so later processes load it in a second.
"""
from __future__ import annotations

import glob
import os
import threading
from types import ModuleType

# _C links against torch's shared libraries (libc10, libtorch); importing torch loads them.
import torch  # noqa: F401

from specdec_plugin import envs

_lock = threading.Lock()
_module: ModuleType | None = None


def _csrc_dir() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "csrc")


def load_extension() -> ModuleType:
    """Return the compiled extension module, JIT-building it only if SPECDEC_JIT_BUILD=1."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        try:
            from specdec_plugin import _C  # type: ignore[attr-defined]

            _module = _C
        except ImportError as err:
            if not envs.jit_build():
                raise ImportError(
                    "specdec_plugin._C is not built; run `pip install -e .` or set "
                    "SPECDEC_JIT_BUILD=1 to compile csrc/ on first use"
                ) from err
            from torch.utils import cpp_extension

            sources = sorted(glob.glob(os.path.join(_csrc_dir(), "*.cpp")))
            if not sources:
                raise ImportError(f"no C++ sources found in {_csrc_dir()}") from err
            _module = cpp_extension.load(
                name="specdec_C_jit",
                sources=sources,
                extra_cflags=["-O3", "-g0", "-std=c++17", "-fopenmp", "-ffp-contract=off"],  # as setup.py
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
    return _module
