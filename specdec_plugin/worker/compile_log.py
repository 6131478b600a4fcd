"""Every Triton compile in a worker, with its whole specialisation key (opt-in diagnostics).

Why: a kernel that compiles again while serving did so because one argument's class differs
from every launch at start-up (a constexpr, a dtype, or Triton's divisibility-by-16 or
equal-to-1 specialisation of an integer or a pointer). vLLM's JIT monitor names the kernel,
but shortens the key to 120 characters, which leaves out the arguments that differ. Seen on the
H100 (session 26): the draft-model engines compiled one ``_attention_tile_kernel`` variant at
their first request with the prefill tile (BLOCK_M = 128), and the logged key stopped after the
seventh pointer. With ``SPECDEC_LOG_TRITON_COMPILES=1`` each compile, at start-up too, is logged
with its whole key, so a late one can be compared with those the warm-up made.

Chained with any hook already installed (vLLM's monitor installs its own later and chains to
the one it finds), so both keep working.
"""
from __future__ import annotations

import time

from specdec_plugin import envs
from specdec_plugin.log import init_logger

logger = init_logger(__name__)

_installed = False


def describe_compile(kwargs) -> str:
    """One line: Triton's own description of the launch (each parameter with its specialised
    type, e.g. ``q_ptr: ('*bf16', 'D')``, 'D' for divisible by 16) and the constexprs; the raw
    key where a Triton version passes no description."""
    compile_info = kwargs.get("compile") if isinstance(kwargs.get("compile"), dict) else {}
    constants = compile_info.get("constants")
    described = kwargs.get("repr")
    if not described:
        fn = kwargs.get("fn")
        described = f"{getattr(fn, 'name', '?')} key={compile_info.get('key', kwargs.get('key'))!r}"
    # The specialisation attributes per argument index (('tt.divisibility', 16) and the like):
    # the GPU image's Triton leaves the types in the description empty (session 26's log).
    configs = compile_info.get("configs")
    attrs = f" attrs={configs[0]!r}" if configs else ""
    return f"{described} constants={constants!r}{attrs}"


def install() -> bool:
    """Install the logging hook once per process, where Triton is present and the variable is
    set. True when installed now."""
    global _installed
    if _installed or not envs.log_triton_compiles():
        return False
    try:
        from triton import knobs
    except ImportError:
        return False
    existing = knobs.runtime.jit_post_compile_hook

    def _log_compile(**kwargs):
        logger.info("specdec_plugin: Triton compile at %s: %s", time.strftime("%H:%M:%S"),
                    describe_compile(kwargs))
        if existing is not None:
            return existing(**kwargs)
        return None

    knobs.runtime.jit_post_compile_hook = _log_compile
    _installed = True
    return True
