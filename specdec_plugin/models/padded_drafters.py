"""Pad the shipped EAGLE-1 and EAGLE-3 heads to match a padded target (see padded_llama.py).

A padded target's residual stream, final hidden state and embeddings are [x, 0]: the small
model's d dims, then D - d zeros. A padded head must map such inputs to [y, 0] where y is the
small head's output, so that its feedback into the next draft step, its norms and the LM head
see what they saw in the small head. The rules of padded_llama.py carry over to the head's
decoder layer; what is new is where its inputs sit:

- EAGLE-1 (vLLM ``EagleLlamaForCausalLM``): ``fc`` [D, 2D] reads concat(embed [D], hidden [D]).
  The small fc's two column halves go to columns 0:d and D:D+d; rows d: are zero (fc writes the
  head's residual stream); the columns that read zero inputs are random. Layer 0 has no
  input_layernorm; there is no final norm; embeddings and LM head are the target's.
- EAGLE-3 (vLLM ``Eagle3LlamaForCausalLM``): ``fc`` [D, 3 D_t] reads three target aux hidden
  states, so the small fc's k-th column block goes to columns k D_t : k D_t + d; rows d: zero.
  The layer's q/k/v read concat(norm(embed) [D], hidden_norm(hidden) [D]): the small columns
  0:d and d:2d go to 0:d and D:D+d. ``lm_head`` [draft_vocab, D] reads the final norm's [y, 0]:
  its columns d: are random. ``d2t``/``t2d`` are copied.

The target's auxiliary layers keep their ids when layers are appended, but vLLM's default for a
target without explicit ids is (2, L/2, L-3) of the *padded* depth. vLLM 0.26 reads the ids
from the draft config's top-level ``eagle_aux_hidden_state_layer_ids`` (the V2 model runner,
v1/worker/gpu/spec_decode/eagle/eagle3_utils.py, reads only that key) or from
``eagle_config["eagle_aux_hidden_state_layer_ids"]`` (V1 runner, gpu_model_runner.py); the
padded config sets both.
"""
from __future__ import annotations

from specdec_plugin.models.padded_llama import (
    LAYER_SUFFIXES,
    BlockFiller,
    PaddedShape,
    Segment,
    check_shape,
    norm_scale,
    pad_layer_tensor,
    padded_config,
)

# The small EAGLE-3 head's aux layers when its config names none (vLLM's default for 30 layers).
DEFAULT_AUX_LAYER_IDS = (2, 15, 27)


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _head_shape_check(config: dict, shape: PaddedShape) -> None:
    check_shape(config, PaddedShape(shape.hidden_size, shape.num_attention_heads,
                                    shape.num_key_value_heads, shape.intermediate_size,
                                    config["num_hidden_layers"]))
    if shape.num_hidden_layers != config["num_hidden_layers"]:
        raise ValueError("a padded head keeps its layer count "
                         f"({config['num_hidden_layers']}), got {shape.num_hidden_layers}")


def _pad_layers(fill: BlockFiller, tensors: dict, config: dict, shape: PaddedShape,
                prefix_of, first_layer_columns=None, first_layer_width=None) -> dict:
    """Every decoder-layer tensor present in ``tensors`` (``prefix_of(i)`` names layer i)."""
    out = {}
    for index in range(config["num_hidden_layers"]):
        prefix = prefix_of(index)
        for suffix in LAYER_SUFFIXES + ("hidden_norm.weight",):
            name = prefix + suffix
            if name not in tensors:
                continue
            wide = index == 0 and first_layer_columns is not None
            out[name] = pad_layer_tensor(
                fill, name, suffix, tensors[name], config, shape,
                input_columns=first_layer_columns if wide else None,
                input_width=first_layer_width if wide else None)
    return out


def _fc(fill: BlockFiller, small, d: int, D: int, part_width: int, parts: int):
    """An fc over ``parts`` concatenated [x, 0] inputs of width ``part_width``, writing [y, 0]."""
    columns = [Segment(k * d, k * part_width, d) for k in range(parts)]
    return fill.matrix("fc.weight", small, (D, parts * part_width), random=True,
                       columns=columns, zero_rows_from=d)


def _known_names(tensors: dict, known: set[str], kind: str) -> None:
    unknown = sorted(set(tensors) - known)
    if unknown:
        raise ValueError(f"unexpected tensors in the {kind} head: {unknown}")


def pad_eagle_state_dict(tensors: dict, config: dict, shape: PaddedShape, seed: int,
                         dtype=None, device="cpu") -> tuple[dict, dict]:
    """(tensors, config) of an EAGLE-1 head padded to ``shape`` (hidden = the padded target's)."""
    _head_shape_check(config, shape)
    dtype = dtype or tensors["fc.weight"].dtype
    fill = BlockFiller(seed, dtype, device)
    d, D = config["hidden_size"], shape.hidden_size
    out = _pad_layers(fill, tensors, config, shape, lambda i: f"layers.{i}.")
    out["fc.weight"] = _fc(fill, tensors["fc.weight"], d, D, D, 2)
    _known_names(tensors, set(out), "EAGLE-1")
    return out, padded_config(config, shape, _dtype_name(dtype))


def eagle3_aux_layer_ids(config: dict) -> list[int]:
    ids = config.get("eagle_aux_hidden_state_layer_ids") \
        or (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return list(ids or DEFAULT_AUX_LAYER_IDS)


def pad_eagle3_state_dict(tensors: dict, config: dict, shape: PaddedShape, seed: int,
                          target_hidden_size: int | None = None, dtype=None,
                          device="cpu") -> tuple[dict, dict]:
    """(tensors, config) of an EAGLE-3 head padded to ``shape``; its fc reads aux hidden states
    of width ``target_hidden_size`` (default ``shape.hidden_size``)."""
    _head_shape_check(config, shape)
    if config.get("norm_before_fc") or config.get("fc_norm") or \
            (config.get("eagle_config") or {}).get("norm_before_fc"):
        raise NotImplementedError("EAGLE-3 heads with norms before fc are not supported")
    dtype = dtype or tensors["fc.weight"].dtype
    fill = BlockFiller(seed, dtype, device)
    d, D = config["hidden_size"], shape.hidden_size
    small_target = config.get("target_hidden_size") or d
    big_target = target_hidden_size or D
    if small_target != d:
        raise ValueError("the small EAGLE-3 head's target_hidden_size must equal its hidden size")
    aux_ids = eagle3_aux_layer_ids(config)
    out = _pad_layers(fill, tensors, config, shape,
                      lambda i: "midlayer." if i == 0 else f"layers.{i}.",
                      first_layer_columns=[Segment(0, 0, d), Segment(d, D, d)],
                      first_layer_width=2 * D)
    out["fc.weight"] = _fc(fill, tensors["fc.weight"], d, D, big_target, len(aux_ids))
    out["norm.weight"] = fill.gain(tensors["norm.weight"], D, norm_scale(d, D))
    head = tensors["lm_head.weight"]
    out["lm_head.weight"] = fill.matrix("lm_head.weight", head, (head.shape[0], D), random=True)
    for name in ("d2t", "t2d"):
        if name in tensors:
            out[name] = tensors[name].clone()
    _known_names(tensors, set(out), "EAGLE-3")

    padded = padded_config(config, shape, _dtype_name(dtype))
    padded["target_hidden_size"] = big_target
    padded["eagle_aux_hidden_state_layer_ids"] = aux_ids
    padded["eagle_config"] = dict(config.get("eagle_config") or {},
                                  eagle_aux_hidden_state_layer_ids=aux_ids,
                                  use_aux_hidden_state=True)
    return out, padded
