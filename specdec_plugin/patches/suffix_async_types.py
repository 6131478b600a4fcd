"""P12: method "suffix" counted among vLLM's async-capable speculative methods while
``SPECDEC_SUFFIX_ASYNC`` is on (unset: the device layer's default, on for CUDA GPUs; see the
catalog).

``VllmConfig.__post_init__`` resolves async scheduling from the method: left unset it turns it
off for suffix (config/vllm.py:1071-1082), asked for it raises (:1038-1045). Turning it back on
in the platform hook, which runs later in the same ``__post_init__`` (:1454), is not enough:
every engine-core process runs ``__post_init__`` again on the config it received
(v1/engine/core.py:1173, after its handshake), finds ``async_scheduling=True`` with method
suffix and raises before any hook of ours runs. Both checks test the method against
``get_args(NgramGPUTypes)``, a name config/vllm.py imports (:49) and uses nowhere else;
rebound there to ``Literal["ngram_gpu", "suffix"]``, vLLM resolves async scheduling for suffix
exactly as for ``ngram_gpu`` (on by default, an explicit ``True`` accepted, an explicit
``False`` kept, the settings that go with it made), in every process.
``SpeculativeConfig.use_ngram_gpu`` compares the method itself and is unaffected.

Applied where configs are built:
- in the process that builds the engine config, by patch P6 around each
  ``EngineArgs.create_engine_config``, reading the environment then, and undone after it (one
  process may build engines with and without the variable: tests);
- in the other vLLM processes (engine core, workers: their environment is fixed), from our
  platform module's import, which vLLM performs before it loads its config modules
  (vllm/utils/torch_utils.py resolves the platform at its own import): the name is rebound as
  soon as config/vllm.py has been executed, by a one-shot import hook for that module.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import sys
from typing import Literal

from specdec_plugin import envs

_MODULE = "vllm.config.vllm"
_NAME = "NgramGPUTypes"
_WITH_SUFFIX = Literal["ngram_gpu", "suffix"]


def _rebind(module) -> None:
    setattr(module, _NAME, _WITH_SUFFIX)


class _RebindAfterImport(importlib.abc.MetaPathFinder):
    """Finds config/vllm.py through the other finders and rebinds the name right after the
    module body has run (before anything can build a config from it); then leaves."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _MODULE:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def exec_then_rebind(module):
                    exec_module(module)
                    _rebind(module)

                spec.loader.exec_module = exec_then_rebind  # this module's loader only
                return spec
        return None


def apply_in_this_process(device_default: str = "0") -> None:
    """From the platform module's import: when the environment (unset: ``device_default``, the
    device layer's ``suffix_async_default``) asks for it, rebind now if config/vllm.py is
    loaded, else as soon as it is."""
    if envs.suffix_async(device_default) == "0":
        return
    module = sys.modules.get(_MODULE)
    if module is not None and hasattr(module, _NAME):
        _rebind(module)
    elif not any(isinstance(f, _RebindAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RebindAfterImport())


@contextlib.contextmanager
def while_building_config(device_default: str = "0"):
    """P6's part: the name rebound for one config build when the environment (unset:
    ``device_default``) asks for it, then as it was."""
    import vllm.config.vllm as module

    original = getattr(module, _NAME)
    if envs.suffix_async(device_default) != "0":
        _rebind(module)
    try:
        yield
    finally:
        setattr(module, _NAME, original)
