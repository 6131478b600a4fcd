"""Pad a Llama checkpoint into a bigger shape that computes exactly the same function.

Notation: the small model has hidden size d, h query / kv KV heads of size hd, MLP width i and l
layers; the padded one has D, H / KV (same hd, same H/KV ratio), I and L. Every matrix of the
padded model holds the small one's weights in its top-left block; the rest is chosen so that

(a) the first d residual dims evolve exactly as in the small model, and
(b) the other D - d residual dims are exactly zero at every layer boundary.

Which blocks must be zero follows from who writes into the residual stream:

- ``embed_tokens`` [V, D]: columns d: are zero, so the stream starts as [x, 0].
- ``o_proj`` [D, H*hd] and ``down_proj`` [D, I] are the only writers: all zero except the
  top-left block. Rows d: must be zero (b); columns of padded heads / MLP units must be zero in
  rows :d, or those units' outputs would leak into the real dims (a).
- ``q/k/v_proj`` [*, D] and ``gate/up_proj`` [I, D] read a normed [x, 0]: their columns d: meet
  zeros and may hold anything, and the rows of padded heads / units compute values that nobody
  reads. Both are random (std ``RANDOM_STD``) so the GEMMs do realistic work. Query head j uses
  KV head j // (H/KV); with the ratio kept, the h real heads still pair with the kv real ones.
- Appended layers l..L-1: random q/k/v/gate/up, all-zero o_proj and down_proj, so x + 0 = x.
- RMSNorm. With the padded dims zero, mean_D(x^2) = (d/D) mean_d(x^2), so with eps' = eps d/D
  the normaliser is sqrt(d/D) * sqrt(mean_d(x^2) + eps): the padded norm's output is
  g' x / (sqrt(d/D) rms_d(x)). Gains g' = g * sqrt(d/D) therefore reproduce g x / rms_d(x)
  exactly. With D = 4d the factor is 1/2, exact in bf16; other ratios round the gains. The gains
  of padded dims multiply zeros: they are set to sqrt(d/D) like the rest of an appended layer's.
- An untied ``lm_head`` [V, D] reads the final norm's [y, 0]: columns d: are random. A tied one
  is the zero-padded embedding, which reads the same.

Rotary embeddings act inside each head of size hd, so they are unchanged.
"""
from __future__ import annotations

import math
import warnings
import zlib
from dataclasses import dataclass
from typing import Iterator

RANDOM_STD = 0.02  # a usual init scale: realistic magnitudes for the ignored units


@dataclass(frozen=True)
class PaddedShape:
    """The padded shape of one Llama-family model (head_dim and GQA ratio come from the small)."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    num_hidden_layers: int


@dataclass(frozen=True)
class Segment:
    """``length`` input dims found at ``small_offset`` in the small matrix's columns and at
    ``big_offset`` in the padded one's (a concatenated input has one segment per part)."""

    small_offset: int
    big_offset: int
    length: int


class BlockFiller:
    """Makes padded tensors: random or zero background, small blocks copied in.

    Every random tensor has its own generator seeded from (seed, name), so a tensor's values do
    not depend on which tensors were made before it.
    """

    def __init__(self, seed: int, dtype, device="cpu"):
        self.seed, self.dtype, self.device = seed, dtype, device

    def background(self, name: str, shape, random: bool):
        import torch

        if not random:
            return torch.zeros(shape, dtype=self.dtype, device=self.device)
        generator = torch.Generator(device=self.device)
        generator.manual_seed((self.seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 62))
        noise = torch.randn(shape, generator=generator, dtype=self.dtype, device=self.device)
        return noise.mul_(RANDOM_STD)

    def matrix(self, name: str, small, shape, *, random: bool, columns: list[Segment] | None = None,
               zero_rows_from: int | None = None):
        """``small``'s rows land in rows 0..r of a [shape] matrix, its columns per ``columns``
        (default: one segment at 0). Rows ``zero_rows_from``: are zero whatever the background."""
        big = self.background(name, shape, random)
        if zero_rows_from is not None:
            big[zero_rows_from:].zero_()
        if small is None:
            return big
        small = small.to(device=self.device, dtype=self.dtype)
        rows = small.shape[0]
        segments = columns or [Segment(0, 0, small.shape[1])]
        for seg in segments:
            big[:rows, seg.big_offset:seg.big_offset + seg.length] = \
                small[:, seg.small_offset:seg.small_offset + seg.length]
        return big

    def vector(self, name: str, small, length: int, *, random: bool):
        """A bias: ``small`` first, then random (a padded unit's) or zero."""
        big = self.background(name, (length,), random)
        if small is not None:
            big[:small.shape[0]] = small.to(device=self.device, dtype=self.dtype)
        return big

    def gain(self, small, length: int, scale: float):
        """An RMSNorm gain over a stream whose dims past ``small``'s are zero (see module doc)."""
        import torch

        big = torch.full((length,), scale, dtype=self.dtype, device=self.device)
        if small is not None:
            big[:small.shape[0]] = (small.to(device=self.device, dtype=torch.float32)
                                    * scale).to(self.dtype)
        return big


def norm_scale(small_hidden: int, big_hidden: int) -> float:
    """sqrt(d/D): the factor on RMSNorm gains (eps gets d/D). Warns when it rounds in bf16."""
    ratio = big_hidden / small_hidden
    exponent = math.log(ratio, 4)
    if abs(exponent - round(exponent)) > 1e-9:
        warnings.warn(f"hidden {small_hidden} -> {big_hidden} is not a power-of-4 widening: "
                      "the padded RMSNorm gains are rounded in bf16", stacklevel=2)
    return math.sqrt(small_hidden / big_hidden)


def head_dim_of(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def check_shape(config: dict, shape: PaddedShape) -> None:
    """Raise ValueError unless ``shape`` can hold ``config``'s model."""
    small = (config["hidden_size"], config["num_attention_heads"],
             config["num_key_value_heads"], config["intermediate_size"],
             config["num_hidden_layers"])
    big = (shape.hidden_size, shape.num_attention_heads, shape.num_key_value_heads,
           shape.intermediate_size, shape.num_hidden_layers)
    if any(b < s for s, b in zip(small, big)):
        raise ValueError(f"padded shape {shape} is smaller than the model's {small}")
    small_group = config["num_attention_heads"] // config["num_key_value_heads"]
    if shape.num_attention_heads != small_group * shape.num_key_value_heads:
        raise ValueError(f"padded heads {shape.num_attention_heads}/{shape.num_key_value_heads}"
                         f" must keep the query-per-KV ratio {small_group}")


def padded_config(config: dict, shape: PaddedShape, dtype_name: str | None = None) -> dict:
    """``config`` with the padded shape, head_dim made explicit and eps scaled by d/D."""
    out = dict(config)
    out["head_dim"] = head_dim_of(config)
    out.update(hidden_size=shape.hidden_size, num_attention_heads=shape.num_attention_heads,
               num_key_value_heads=shape.num_key_value_heads,
               intermediate_size=shape.intermediate_size,
               num_hidden_layers=shape.num_hidden_layers)
    out["rms_norm_eps"] = config["rms_norm_eps"] * config["hidden_size"] / shape.hidden_size
    if isinstance(out.get("layer_types"), list):
        out["layer_types"] = (out["layer_types"] + [out["layer_types"][-1]]
                              * shape.num_hidden_layers)[:shape.num_hidden_layers]
    if dtype_name is not None:
        out["torch_dtype"] = out["dtype"] = dtype_name
    return out


# suffix -> (role, which padded axis its rows span)
_READERS = {"self_attn.q_proj": "q", "self_attn.k_proj": "kv", "self_attn.v_proj": "kv",
            "mlp.gate_proj": "mlp", "mlp.up_proj": "mlp"}
_WRITERS = {"self_attn.o_proj": "q", "mlp.down_proj": "mlp"}
LAYER_SUFFIXES = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                  "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                  "post_attention_layernorm.weight", "mlp.gate_proj.weight",
                  "mlp.up_proj.weight", "mlp.down_proj.weight")


def pad_layer_tensor(fill: BlockFiller, name: str, suffix: str, small, config: dict,
                     shape: PaddedShape, input_columns: list[Segment] | None = None,
                     input_width: int | None = None):
    """One decoder-layer tensor (``suffix`` after ``layers.N.``); ``small`` None for an appended
    layer. ``input_columns``/``input_width`` describe a q/k/v input wider than the residual (an
    EAGLE-3 layer reads concat(embeds, hidden))."""
    hd = head_dim_of(config)
    rows_of = {"q": shape.num_attention_heads * hd, "kv": shape.num_key_value_heads * hd,
               "mlp": shape.intermediate_size}
    scale = norm_scale(config["hidden_size"], shape.hidden_size)
    base, _, kind = suffix.rpartition(".")
    if suffix.endswith("norm.weight"):
        return fill.gain(small, shape.hidden_size, scale)
    if base in _READERS and kind == "bias":
        return fill.vector(name, small, rows_of[_READERS[base]], random=True)
    if base in _READERS:
        width = shape.hidden_size
        if input_width is not None and base.startswith("self_attn."):
            width = input_width
        columns = input_columns if base.startswith("self_attn.") else None
        return fill.matrix(name, small, (rows_of[_READERS[base]], width), random=True,
                           columns=columns)
    if base in _WRITERS and kind == "weight":
        return fill.matrix(name, small, (shape.hidden_size, rows_of[_WRITERS[base]]),
                           random=False)
    raise ValueError(f"don't know how to pad layer tensor {name!r}")


def iter_padded_llama(tensors: dict, config: dict, shape: PaddedShape, seed: int,
                      dtype=None, device="cpu") -> Iterator[tuple[str, object]]:
    """Yield the padded checkpoint tensor by tensor, layer by layer (peak memory: one tensor)."""
    check_shape(config, shape)
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise NotImplementedError("padding a Llama with biases is not supported")
    dtype = dtype or tensors["model.embed_tokens.weight"].dtype
    fill = BlockFiller(seed, dtype, device)
    d, D = config["hidden_size"], shape.hidden_size
    embed = tensors["model.embed_tokens.weight"]
    yield "model.embed_tokens.weight", fill.matrix("model.embed_tokens.weight", embed,
                                                   (embed.shape[0], D), random=False)
    for index in range(shape.num_hidden_layers):
        real = index < config["num_hidden_layers"]
        for suffix in LAYER_SUFFIXES:
            name = f"model.layers.{index}.{suffix}"
            small = tensors.get(name) if real else None
            if real and small is None:
                raise KeyError(f"{name} missing from the small checkpoint")
            yield name, pad_layer_tensor(fill, name, suffix, small, config, shape)
    yield "model.norm.weight", fill.gain(tensors["model.norm.weight"], D, norm_scale(d, D))
    if not config.get("tie_word_embeddings", False) and "lm_head.weight" in tensors:
        head = tensors["lm_head.weight"]
        yield "lm_head.weight", fill.matrix("lm_head.weight", head, (head.shape[0], D),
                                            random=True)


def pad_llama_state_dict(tensors: dict, config: dict, shape: PaddedShape, seed: int,
                         dtype=None, device="cpu") -> tuple[dict, dict]:
    """(padded tensors, padded config) of a Llama checkpoint with vLLM/HF names; the tensors
    are in ``dtype`` (default: the embedding's) on ``device``."""
    out = dict(iter_padded_llama(tensors, config, shape, seed, dtype=dtype, device=device))
    dtype_name = str(out["model.embed_tokens.weight"].dtype).removeprefix("torch.")
    return out, padded_config(config, shape, dtype_name)


def llama_param_count(config: dict) -> int:
    """Parameters of a Llama with this config (norms included, a tied LM head counted once)."""
    hd, d = head_dim_of(config), config["hidden_size"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    per_layer = d * (2 * q + 2 * kv) + 3 * d * config["intermediate_size"] + 2 * d
    head = 0 if config.get("tie_word_embeddings", False) else config["vocab_size"] * d
    return (config["vocab_size"] * d + config["num_hidden_layers"] * per_layer + d + head)
