"""Our norm / rotary / activation kernels inside vLLM's model layers, as out-of-tree CustomOps.

vLLM builds ``RMSNorm``, ``SiluAndMul`` and ``RotaryEmbedding`` (and the rotary subclasses that
only change the cos/sin cache, e.g. ``Llama3RotaryEmbedding``) through ``CustomOp.__new__``,
which instantiates the class registered in ``op_registry_oot`` under the in-tree *class name*
instead. ``register_custom_ops`` registers a subclass of each whose ``forward_oot`` runs our
kernel from the registry, and falls back to vLLM's ``forward_native`` for what the kernel does
not cover. Layers built before the call keep the in-tree class, so call it in the worker process
before the model (and the drafter) is built.

Which forward runs (``CustomOp.dispatch_forward``, fixed when each layer is built): an
*enabled* op on an out-of-tree platform runs ``forward_oot``; a disabled one runs
``forward_native`` (SiluAndMul's wrapped in ``torch.compile`` with the platform's
``simple_compile_backend``). ``compilation_config.custom_ops`` defaults to ``["none"]`` (all
off) when the backend is inductor and compilation is on, else ``["all"]`` (so under
enforce_eager / ``mode=NONE`` our kernels run); ``+rms_norm`` / ``-silu_and_mul`` etc. override.
``register_oot`` renames the class to the registry key ("RMSNorm"); we set the in-tree op name
back, so those ``+name`` / ``-name`` switches keep applying to our subclasses. The switch is
read once per process config, not per model: a drafter that runs eagerly next to a compiled
target gets ``forward_native`` too, unless it is built inside ``custom_ops_forced(True)``.
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Iterator, Sequence

import torch
from specdec_plugin.log import init_logger

from specdec_plugin.ops.registry import get_kernel

logger = init_logger(__name__)

# Kernel providers, in order of preference, for layers built from now on.
_providers: tuple[str, ...] = ("torch",)
# Set by custom_ops_forced: our layers built meanwhile are enabled / disabled regardless of
# compilation_config.custom_ops. None: follow it, as vLLM's own layers do.
_forced: bool | None = None

_ROTARY_MODULE = "vllm.model_executor.layers.rotary_embedding"
# RotaryEmbedding subclasses that differ only in how the cos/sin cache is computed. Any of them
# that overrides a forward in the installed vLLM is skipped (checked at registration).
_PLAIN_ROTARY_CLASSES = (
    ("base", "RotaryEmbedding"),
    ("llama3_rope", "Llama3RotaryEmbedding"),
    ("linear_scaling_rope", "LinearScalingRotaryEmbedding"),
    ("ntk_scaling_rope", "NTKScalingRotaryEmbedding"),
    ("dynamic_ntk_scaling_rope", "DynamicNTKScalingRotaryEmbedding"),
    ("dynamic_ntk_alpha_rope", "DynamicNTKAlphaRotaryEmbedding"),
    ("yarn_scaling_rope", "YaRNScalingRotaryEmbedding"),
    ("telechat3_scaling_rope", "TeleChat3RoPEScaledRotaryEmbedding"),
    ("gemma4_rope", "Gemma4RotaryEmbedding"),
)


class _Switchable:
    """``enabled()`` (read by ``CustomOp.dispatch_forward`` at construction) obeys
    ``custom_ops_forced`` when it is active."""

    @classmethod
    def enabled(cls) -> bool:
        return _forced if _forced is not None else super().enabled()


@contextlib.contextmanager
def custom_ops_forced(enabled: bool = True) -> Iterator[None]:
    """Layers of ours built inside run ``forward_oot`` (True) or ``forward_native`` (False)
    whatever ``compilation_config.custom_ops`` says, e.g. an eagerly run drafter built in a
    process whose config disables custom ops for the compiled target."""
    global _forced
    previous, _forced = _forced, enabled
    try:
        yield
    finally:
        _forced = previous


class _RMSNormOot(_Switchable):
    """Mixed in front of vLLM's RMSNorm."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._specdec_kernel = get_kernel("rms_norm", _providers)

    def forward_oot(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        # var_hidden_size (variance over a prefix of the row) is not part of our op.
        if self.variance_size_override is not None or x.shape[-1] != self.weight.shape[0]:
            return self.forward_native(x, residual)
        if residual is not None and residual.shape != x.shape:
            return self.forward_native(x, residual)
        use_weight = self.pass_weight if residual is None else self.pass_weight_add
        weight = self.weight.data if use_weight else None
        return self._specdec_kernel(x, weight, self.variance_epsilon, residual)


class _SiluAndMulOot(_Switchable):
    """Mixed in front of vLLM's SiluAndMul."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._specdec_kernel = get_kernel("silu_and_mul", _providers)

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] % 2:
            return self.forward_native(x)
        return self._specdec_kernel(x)


def _rotates_in_place(x: torch.Tensor, num_tokens: int, head_size: int) -> bool:
    """Whether ``x`` has a ``[tokens, heads, head_size]`` view, unit-strided per head."""
    try:
        return x.view(num_tokens, -1, head_size).stride(2) == 1
    except RuntimeError:
        return False


class _RotaryOot(_Switchable):
    """Mixed in front of vLLM's RotaryEmbedding (or a subclass with the same forward)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._specdec_kernel = get_kernel("rotary_embedding", _providers)

    def forward_oot(self, positions: torch.Tensor, query: torch.Tensor,
                    key: torch.Tensor | None = None):
        cos_sin_cache = self._match_cos_sin_cache_dtype(query)
        num_tokens = positions.numel()
        if (
            cos_sin_cache.shape[-1] != self.rotary_dim
            or (key is not None and key.dtype != query.dtype)
            or not _rotates_in_place(query, num_tokens, self.head_size)
            or (key is not None and not _rotates_in_place(key, num_tokens, self.head_size))
        ):
            return self.forward_native(positions, query, key)
        # In place, like vLLM's CUDA op; callers use the returned tensors either way.
        return self._specdec_kernel(positions, query, key, cos_sin_cache, self.head_size,
                                    self.rotary_dim, self.is_neox_style)


def _register(base: type, mixin: type) -> type | None:
    """Register ``mixin`` + ``base`` as the OOT replacement of ``base``; None if one exists."""
    from vllm.model_executor.custom_op import CustomOp, op_registry_oot

    key = base.__name__  # what CustomOp.__new__ looks up
    existing = op_registry_oot.get(key)
    if existing is not None:
        if not getattr(existing, "_specdec_oot", False):
            logger.warning("specdec_plugin: %s already has an out-of-tree replacement (%s); "
                           "leaving it in place", key, existing.__qualname__)
        return None
    in_tree_name = base.name
    oot_cls = type(f"SpecDec{key}", (mixin, base), {"_specdec_oot": True,
                                                    "__module__": __name__})
    CustomOp.register_oot(oot_cls, name=key)
    # register_oot set name = key; keep vLLM's op name so custom_ops "+rms_norm" still applies.
    oot_cls.name = in_tree_name
    return oot_cls


def _plain_rotary_classes() -> list[type]:
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    classes = []
    for module, name in _PLAIN_ROTARY_CLASSES:
        try:
            cls = getattr(importlib.import_module(f"{_ROTARY_MODULE}.{module}"), name)
        except (ImportError, AttributeError):
            continue
        same_forward = all(getattr(cls, f) is getattr(RotaryEmbedding, f)
                           for f in ("forward_native", "forward_static", "forward_cuda"))
        if same_forward and "forward" not in cls.__dict__:
            classes.append(cls)
    return classes


def register_custom_ops(providers: Sequence[str] = ("torch",)) -> list[str]:
    """Make vLLM build our subclasses of its RMSNorm, SiluAndMul and plain RotaryEmbedding
    layers, running the kernels of the first of ``providers`` that has one (torch last).

    Idempotent; a later call only changes the providers of layers built after it. Returns the
    class names newly registered.
    """
    global _providers
    _providers = tuple(providers)
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm

    pairs = [(RMSNorm, _RMSNormOot), (SiluAndMul, _SiluAndMulOot)]
    pairs += [(cls, _RotaryOot) for cls in _plain_rotary_classes()]
    registered = [base.__name__ for base, mixin in pairs if _register(base, mixin) is not None]
    if registered:
        logger.info("specdec_plugin: out-of-tree layers %s (kernels: %s)", registered, _providers)
    return registered
