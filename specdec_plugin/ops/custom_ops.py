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
target gets ``forward_native`` too.

The kernel providers are passed down, not kept in module state: each registered class carries
the providers it was registered with (``kernel_providers``), and every layer it builds picks its
kernel from them. A later ``register_custom_ops`` with other providers registers new classes for
the layers built after it; layers already built keep theirs.
"""
from __future__ import annotations

import importlib
from typing import Sequence

import torch
from specdec_plugin.log import init_logger

from specdec_plugin.ops.registry import get_kernel

logger = init_logger(__name__)

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


class _KernelLayer:
    """Mixed in front of one of vLLM's layers; the registered class sets ``kernel_providers``
    (``_register``) and ``_specdec_op`` names the registry kernel its ``forward_oot`` runs."""

    kernel_providers: tuple[str, ...] = ("torch",)
    _specdec_op: str

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._specdec_kernel = get_kernel(self._specdec_op, self.kernel_providers)


class _RMSNormOot(_KernelLayer):
    """Mixed in front of vLLM's RMSNorm."""

    _specdec_op = "rms_norm"

    def forward_oot(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        # var_hidden_size (variance over a prefix of the row) is not part of our op.
        if self.variance_size_override is not None or x.shape[-1] != self.weight.shape[0]:
            return self.forward_native(x, residual)
        if residual is not None and residual.shape != x.shape:
            return self.forward_native(x, residual)
        use_weight = self.pass_weight if residual is None else self.pass_weight_add
        weight = self.weight.data if use_weight else None
        return self._specdec_kernel(x, weight, self.variance_epsilon, residual)


class _SiluAndMulOot(_KernelLayer):
    """Mixed in front of vLLM's SiluAndMul."""

    _specdec_op = "silu_and_mul"

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


class _RotaryOot(_KernelLayer):
    """Mixed in front of vLLM's RotaryEmbedding (or a subclass with the same forward)."""

    _specdec_op = "rotary_embedding"

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


def _register(base: type, mixin: type, providers: tuple[str, ...]) -> type | None:
    """Register ``mixin`` + ``base``, running ``providers``' kernels, as the OOT replacement of
    ``base``; None if that is already registered or another plugin's replacement exists."""
    from vllm.model_executor.custom_op import CustomOp, op_registry_oot

    key = base.__name__  # what CustomOp.__new__ looks up
    existing = op_registry_oot.get(key)
    if existing is not None:
        if not getattr(existing, "_specdec_oot", False):
            logger.warning("specdec_plugin: %s already has an out-of-tree replacement (%s); "
                           "leaving it in place", key, existing.__qualname__)
            return None
        if existing.kernel_providers == providers:
            return None
        del op_registry_oot[key]  # ours, with other providers: replace it
    in_tree_name = base.name
    oot_cls = type(f"SpecDec{key}", (mixin, base), {"_specdec_oot": True,
                                                    "kernel_providers": providers,
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

    Idempotent; a later call with other providers changes only the layers built after it.
    Returns the class names newly registered (or re-registered with other providers).
    """
    providers = tuple(providers)
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm

    pairs = [(RMSNorm, _RMSNormOot), (SiluAndMul, _SiluAndMulOot)]
    pairs += [(cls, _RotaryOot) for cls in _plain_rotary_classes()]
    registered = [base.__name__ for base, mixin in pairs
                  if _register(base, mixin, providers) is not None]
    if registered:
        logger.info("specdec_plugin: out-of-tree layers %s (kernels: %s)", registered, providers)
    return registered
