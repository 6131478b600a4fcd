"""Async scheduling by default for the draft model, where the device layer says so.

vLLM 0.26 resolves an unset ``async_scheduling`` to off for method ``draft_model``
(config/vllm.py, the ``async_scheduling is None`` branch) although its runner supports it
and accepts an explicit ``async_scheduling=True`` for that method (the explicit branch). Off,
every step waits for the host to schedule and prepare the next one: on the H100 that cost
1.22-1.36x of plain decoding when every draft missed, where async steps cost 1.00-1.03x
(BENCHMARKS.md, session 14). The choice has to be made on ``EngineArgs``, before vLLM builds
its config (patch P6): afterwards the platform cannot tell "unset" from "the user said no",
and the settings vLLM derives from async scheduling are already fixed.

Only an unset value changes: ``--no-async-scheduling`` (``async_scheduling=False``) wins. And
only where vLLM would accept the explicit value: executors that run async scheduling (vLLM's
``mp`` and ``uni``; Ray does not in 0.26) and padded drafter batches.
"""
from __future__ import annotations

from specdec_plugin.log import init_logger
from specdec_plugin.spec_decode.config_checks import speculative_method

logger = init_logger(__name__)

# method -> the device layer's flag that turns async scheduling on for it by default
ASYNC_BY_DEFAULT: dict[str, str] = {"draft_model": "async_draft_model"}

# The executors whose ``supports_async_scheduling()`` is True in vLLM 0.26 (v1/executor/).
_ASYNC_EXECUTORS = ("mp", "uni")


def _ray_may_be_chosen(args) -> bool:
    """Whether vLLM may pick its Ray executor for an unset backend (config/parallel.py)."""
    if getattr(args, "data_parallel_backend", None) == "ray":
        return True
    try:
        import ray
    except ImportError:
        return False
    return bool(ray.is_initialized())


def executor_runs_async(args) -> bool:
    backend = getattr(args, "distributed_executor_backend", None)
    if backend is None:
        return not _ray_may_be_chosen(args)
    return backend in _ASYNC_EXECUTORS


def default_async_scheduling(args, spec: dict, device_layer) -> bool | None:
    """The ``async_scheduling`` value to give vLLM: the user's where set, else True for the
    methods and devices listed above, else None (vLLM decides)."""
    if args.async_scheduling is not None or not isinstance(spec, dict):
        return args.async_scheduling
    flag = ASYNC_BY_DEFAULT.get(speculative_method(spec))
    if flag is None or not getattr(device_layer, flag, False):
        return None
    if spec.get("disable_padded_drafter_batch") or not executor_runs_async(args):
        return None
    logger.info("specdec_plugin: async scheduling on for speculative method %r on %s "
                "(vLLM leaves it off for this method unless asked; --no-async-scheduling "
                "turns it off)", speculative_method(spec), device_layer.name)
    return True
