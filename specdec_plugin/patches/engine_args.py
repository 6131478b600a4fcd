"""P6: validate user input before vLLM builds its ModelConfig (see the catalog).

vLLM reads the model's config while building ``ModelConfig``, before any platform hook sees
the arguments; a missing local path then surfaces as a Hugging Face Hub error about repo ids.
This wraps ``EngineArgs.create_engine_config`` so our input checks run first, and records the
user's graph capture sizes for the platform (which otherwise sees them merged with vLLM's
defaults, see capture_sizes.py), and picks where method "ngram" matches (host or device,
spec_decode/ngram_device.py) while vLLM can still resolve async scheduling from it. It is installed
by the ``vllm.general_plugins`` entry point, which vLLM loads in ``EngineArgs.__post_init__``.
"""
from __future__ import annotations

import functools
import os


def _looks_local(path: str) -> bool:
    return os.path.isabs(path) or path.startswith((".", "~"))


def check_model_path(field: str, path: str | None) -> None:
    from specdec_plugin.config_checks import SpecDecConfigError

    if not path or not _looks_local(path):
        return
    full = os.path.expanduser(path)
    if not os.path.exists(full):
        raise SpecDecConfigError(
            f"{field}={path!r}: no such file or directory. Fix: pass the directory of a Hugging "
            f"Face checkpoint (config.json plus *.safetensors), for example the path printed by "
            f"`specdec-models fetch smollm2-135m`."
        )
    if os.path.isdir(full) and not os.path.exists(os.path.join(full, "config.json")):
        raise SpecDecConfigError(
            f"{field}={path!r} has no config.json, so it is not a Hugging Face checkpoint. "
            f"Fix: point {field} at the directory that holds config.json and the weights."
        )


def _speculative_model(spec) -> str | None:
    if isinstance(spec, dict):
        return spec.get("model")
    return getattr(spec, "model", None)


def _user_capture_sizes(args) -> list[int] | None:
    # `--cudagraph-capture-sizes` and `compilation_config.cudagraph_capture_sizes` are exclusive.
    sizes = getattr(args, "cudagraph_capture_sizes", None)
    if sizes is None:
        compilation = args.compilation_config
        sizes = (compilation.get("cudagraph_capture_sizes") if isinstance(compilation, dict)
                 else getattr(compilation, "cudagraph_capture_sizes", None))
    return None if sizes is None else list(sizes)


def _checked(create_engine_config):
    @functools.wraps(create_engine_config)
    def create_engine_config_checked(self, *args, **kwargs):
        check_model_path("model", self.model)
        from vllm.platforms import current_platform

        layer = getattr(current_platform, "device", None)  # None: not our platform
        if self.speculative_config is not None:
            from specdec_plugin.spec_decode.config_checks import (
                NGRAM_MODEL_NAMES,
                validate_speculative_config,
            )

            spec = self.speculative_config
            if isinstance(spec, str):  # `--speculative-config '{...}'` arrives parsed; be safe
                import json

                spec = json.loads(spec)
            if _speculative_model(spec) not in NGRAM_MODEL_NAMES:
                check_model_path("speculative_config.model", _speculative_model(spec))
            validate_speculative_config(spec, self.model)
            # Method "ngram" runs where the device layer says (spec_decode/ngram_device.py):
            # chosen here, before vLLM resolves async scheduling from the method.
            if isinstance(spec, dict) and layer is not None:
                from specdec_plugin.spec_decode.ngram_device import device_ngram_method

                self.speculative_config = device_ngram_method(spec, layer)
                # Likewise async scheduling for the draft model (spec_decode/async_default.py).
                from specdec_plugin.spec_decode.async_default import default_async_scheduling

                self.async_scheduling = default_async_scheduling(self, spec, layer)
        # Let the platform tell the user's capture sizes from vLLM's defaults (capture_sizes.py).
        from specdec_plugin.capture_sizes import recording_user_sizes

        # Method "suffix" async-capable while SPECDEC_SUFFIX_ASYNC is on (patch P12; unset, the
        # device layer decides).
        from specdec_plugin.patches.suffix_async_types import while_building_config

        suffix_default = getattr(layer, "suffix_async_default", "0")
        with (recording_user_sizes(_user_capture_sizes(self)),
              while_building_config(suffix_default)):
            return create_engine_config(self, *args, **kwargs)

    create_engine_config_checked.__specdec_checked__ = True
    return create_engine_config_checked


def apply() -> None:
    from vllm.engine.arg_utils import EngineArgs

    if not getattr(EngineArgs.create_engine_config, "__specdec_checked__", False):
        EngineArgs.create_engine_config = _checked(EngineArgs.create_engine_config)
