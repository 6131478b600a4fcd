"""Padded checkpoints compute the small model's function (specdec_plugin/models/padded*.py).

- A tiny random Llama padded 4x in width (+2 layers, wider MLP, more heads), in fp32 through
  transformers: logits within 1e-4, identical greedy tokens, and every residual stream is
  [small's, exact zeros]; untied and tied LM heads.
- The shipped EAGLE-1 and EAGLE-3 heads padded to SmolLM2-7B-class width, run by a small torch
  forward written here (vLLM's head math) on real SmolLM2 hidden states: the padded output is
  [small output, exact zeros], draft logits match, also on a second draft step.
- The builder's directories: a sharded target loads with transformers and gives the same
  logits; the padded draft model loads too; the EAGLE-3 config names its aux layers.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specdec_plugin.models import tiny_checkpoint
from specdec_plugin.models.drafters import draft_model_tensors, load_shipped_tensors, shipped_files
from specdec_plugin.models.padded import PaddedShapes, build_padded_checkpoints
from specdec_plugin.models.padded_drafters import pad_eagle3_state_dict, pad_eagle_state_dict
from specdec_plugin.models.padded_llama import PaddedShape, pad_llama_state_dict

TINY_PADDED = PaddedShape(hidden_size=256, num_attention_heads=16, num_key_value_heads=8,
                          intermediate_size=384, num_hidden_layers=4)
# SmolLM2's heads padded 4x: the width the padded target's hidden states have.
HEAD_SHAPE = PaddedShape(2304, 36, 12, 1536, 1)


def _read(folder):
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "model.safetensors"))
    return tensors, json.loads((folder / "config.json").read_text())


def _hf_llama(tensors: dict, config: dict):
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**config)).float().eval()
    state = {k: v.float() for k, v in tensors.items()}
    state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    model.load_state_dict(state, strict=True)
    return model


def _tiny_llama(tied: bool):
    tensors, config = _read(tiny_checkpoint("llama"))
    if tied:
        tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}
        config = dict(config, tie_word_embeddings=True)
    return tensors, config


def _greedy(model, prompt, steps: int) -> list[int]:
    ids = prompt.clone()
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
    return ids[0, prompt.shape[1]:].tolist()


def _assert_padded(big, small, tol=1e-4):
    """``big`` is [``small`` (to tol, relative to its scale), exact zeros]."""
    d = small.shape[-1]
    scale = small.abs().max().item() + 1e-6
    assert (big[..., :d] - small).abs().max().item() <= tol * scale
    assert torch.count_nonzero(big[..., d:]).item() == 0


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_padded_tiny_llama_computes_the_same_function(tied):
    tensors, config = _tiny_llama(tied)
    padded, padded_config = pad_llama_state_dict(tensors, config, TINY_PADDED, seed=1)
    assert padded_config["hidden_size"] == 256 and padded_config["num_hidden_layers"] == 4
    assert padded_config["rms_norm_eps"] == pytest.approx(config["rms_norm_eps"] / 4)
    # The ignored blocks are random, not zero: the GEMMs do real work.
    q = padded["model.layers.0.self_attn.q_proj.weight"]
    assert q[64:].std() > 0.01 and q[:64, 64:].std() > 0.01
    small, big = _hf_llama(tensors, config), _hf_llama(padded, padded_config)

    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, config["vocab_size"], (2, 13), generator=generator)
    with torch.no_grad():
        out_small = small(ids, output_hidden_states=True)
        out_big = big(ids, output_hidden_states=True)
    assert (out_big.logits - out_small.logits).abs().max().item() < 1e-4
    # Residual streams before each real layer, then after the appended (zero-output) layers.
    for index in range(config["num_hidden_layers"]):
        _assert_padded(out_big.hidden_states[index], out_small.hidden_states[index])
    real = config["num_hidden_layers"]
    assert torch.count_nonzero(out_big.hidden_states[real][..., 64:]).item() == 0
    for index in range(real + 1, TINY_PADDED.num_hidden_layers):
        assert torch.equal(out_big.hidden_states[index], out_big.hidden_states[real])
    _assert_padded(out_big.hidden_states[-1], out_small.hidden_states[-1])
    assert _greedy(big, ids[:1, :5], 12) == _greedy(small, ids[:1, :5], 12)


def test_padding_refuses_shapes_that_cannot_hold_the_model():
    tensors, config = _tiny_llama(False)
    with pytest.raises(ValueError, match="ratio"):
        pad_llama_state_dict(tensors, config, PaddedShape(256, 16, 4, 384, 4), seed=0)
    with pytest.raises(ValueError, match="smaller"):
        pad_llama_state_dict(tensors, config, PaddedShape(256, 16, 8, 64, 4), seed=0)


# ------------------------------------------------------------------ EAGLE heads, vLLM's math

def _rms(x, gain, eps):
    return gain * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, positions, theta):
    half = x.shape[-1] // 2
    inv_freq = 1.0 / theta ** (torch.arange(half, dtype=torch.float32) / half)
    angles = positions[:, None].float() * inv_freq[None]
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _attention(x, w, prefix, cfg):
    tokens, hd = x.shape[0], cfg["head_dim"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    positions = torch.arange(tokens)
    q = (x @ w[prefix + "q_proj.weight"].T).view(tokens, heads, hd)
    k = (x @ w[prefix + "k_proj.weight"].T).view(tokens, kv_heads, hd)
    v = (x @ w[prefix + "v_proj.weight"].T).view(tokens, kv_heads, hd)
    q, k = _rope(q, positions, cfg["rope_theta"]), _rope(k, positions, cfg["rope_theta"])
    # Query head j reads KV head j // (heads / kv_heads), as in vLLM and transformers.
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                         v.transpose(0, 1), is_causal=True)
    return out.transpose(0, 1).reshape(tokens, heads * hd) @ w[prefix + "o_proj.weight"].T


def _mlp(x, w, prefix):
    gate, up = x @ w[prefix + "gate_proj.weight"].T, x @ w[prefix + "up_proj.weight"].T
    return (F.silu(gate) * up) @ w[prefix + "down_proj.weight"].T


def _eagle1_step(w, cfg, embeds, hidden):
    """vLLM llama_eagle.py: fc, then a layer whose input norm is skipped; no final norm."""
    x = torch.cat([embeds, hidden], -1) @ w["fc.weight"].T
    x = x + _attention(x, w, "layers.0.self_attn.", cfg)
    normed = _rms(x, w["layers.0.post_attention_layernorm.weight"], cfg["rms_norm_eps"])
    return x + _mlp(normed, w, "layers.0.mlp.")


def _eagle3_step(w, cfg, embeds, hidden):
    """vLLM llama_eagle3.py (norm after residual); ``hidden`` is the fc output, or the previous
    step's pre-norm output. Returns (pre-norm output fed back, draft-vocab logits)."""
    eps = cfg["rms_norm_eps"]
    attn_in = torch.cat([_rms(embeds, w["midlayer.input_layernorm.weight"], eps),
                         _rms(hidden, w["midlayer.hidden_norm.weight"], eps)], -1)
    x = hidden + _attention(attn_in, w, "midlayer.self_attn.", cfg)
    x = x + _mlp(_rms(x, w["midlayer.post_attention_layernorm.weight"], eps), w, "midlayer.mlp.")
    return x, _rms(x, w["norm.weight"], eps) @ w["lm_head.weight"].T


@pytest.fixture(scope="module")
def smollm2_states(smollm2_path):
    """SmolLM2's embeddings, final hidden states and aux states 2/15/27 for a short prompt."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 504, 3575, 282, 4649, 314, 7042, 30, 378]])
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    embed = model.model.embed_tokens.weight.detach()
    return {"ids": ids[0], "embed": embed, "final": out.hidden_states[-1][0],
            "aux": [out.hidden_states[i][0] for i in (2, 15, 27)]}


def _zero_pad(x, width):
    return F.pad(x, (0, width - x.shape[-1]))


def _fp32(tensors):
    return {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}


def test_padded_eagle_head_output_is_small_output_then_zeros(smollm2_states):
    small = _fp32(load_shipped_tensors("eagle"))
    cfg = json.loads(shipped_files("eagle")[1].read_text())
    big, big_cfg = pad_eagle_state_dict(small, cfg, HEAD_SHAPE, seed=5)
    assert big["fc.weight"].shape == (2304, 4608) and big_cfg["hidden_size"] == 2304
    D, s = 2304, smollm2_states
    embeds = s["embed"][s["ids"]]
    # The padded target's embedding and final hidden state are the small ones, zero-padded.
    out_small = _eagle1_step(small, cfg, embeds, s["final"])
    out_big = _eagle1_step(big, big_cfg, _zero_pad(embeds, D), _zero_pad(s["final"], D))
    _assert_padded(out_big, out_small)
    # Draft logits through the target's (tied, zero-padded) LM head pick the same tokens.
    logits_small = out_small @ s["embed"].T
    logits_big = out_big @ _zero_pad(s["embed"], D).T
    assert torch.equal(logits_big.argmax(-1), logits_small.argmax(-1))


def test_padded_eagle3_head_output_is_small_output_then_zeros(smollm2_states):
    small = _fp32(load_shipped_tensors("eagle3"))
    cfg = json.loads(shipped_files("eagle3")[1].read_text())
    big, big_cfg = pad_eagle3_state_dict(small, cfg, HEAD_SHAPE, seed=5)
    assert big_cfg["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert big_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert big_cfg["target_hidden_size"] == 2304
    assert torch.equal(big["d2t"], small["d2t"]) and torch.equal(big["t2d"], small["t2d"])
    D, s = 2304, smollm2_states
    embeds = s["embed"][s["ids"]]
    fc_small = torch.cat(s["aux"], -1) @ small["fc.weight"].T
    fc_big = torch.cat([_zero_pad(a, D) for a in s["aux"]], -1) @ big["fc.weight"].T
    _assert_padded(fc_big, fc_small)
    hidden_small, logits_small = _eagle3_step(small, cfg, embeds, fc_small)
    hidden_big, logits_big = _eagle3_step(big, big_cfg, _zero_pad(embeds, D), fc_big)
    _assert_padded(hidden_big, hidden_small)
    assert (logits_big - logits_small).abs().max() <= 1e-4 * logits_small.abs().max()
    # Second draft step: the head's own pre-norm output comes back as its hidden input.
    again_small, _ = _eagle3_step(small, cfg, embeds, hidden_small)
    again_big, _ = _eagle3_step(big, big_cfg, _zero_pad(embeds, D), hidden_big)
    _assert_padded(again_big, again_small, tol=1e-3)


# ------------------------------------------------------------------ checkpoint directories

def test_built_target_is_sharded_and_loads_in_transformers(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    source = tiny_checkpoint("llama")
    shapes = PaddedShapes(target=TINY_PADDED, draft_model=TINY_PADDED, head_intermediate_size=1)
    built = build_padded_checkpoints(tmp_path, source, shapes, kinds=("target",), seed=2,
                                     dtype=torch.float32, max_shard_bytes=1 << 20)
    folder = built["target"]
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert (folder / "tokenizer.json").exists()
    config = AutoConfig.from_pretrained(folder)
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
            config.intermediate_size, config.num_hidden_layers) == (256, 16, 8, 384, 4)
    assert config.head_dim == 16
    big = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    small = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    ids = torch.randint(0, config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert (big(ids).logits - small(ids).logits).abs().max().item() < 1e-4
    # A second call finds the marker and leaves the directory alone.
    stamp = (folder / "config.json").stat().st_mtime_ns
    build_padded_checkpoints(tmp_path, source, shapes, kinds=("target",), seed=2,
                             dtype=torch.float32, max_shard_bytes=1 << 20)
    assert (folder / "config.json").stat().st_mtime_ns == stamp


def test_built_drafters_load_and_match(tmp_path, smollm2_path):
    from transformers import AutoModelForCausalLM

    shapes = PaddedShapes(target=PaddedShape(2304, 36, 12, 2048, 32),
                          draft_model=PaddedShape(2304, 36, 12, 2048, 5),
                          head_intermediate_size=1536)
    built = build_padded_checkpoints(tmp_path, smollm2_path, shapes,
                                     kinds=("draft_model", "eagle", "eagle3"), seed=0)
    assert set(built) == {"draft_model", "eagle", "eagle3"}
    draft_dir = built["draft_model"]
    assert (draft_dir / "tokenizer.json").exists()
    big = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    assert big.config.hidden_size == 2304 and big.config.num_hidden_layers == 5
    # The shipped draft leaves out its embedding, the target's: it comes from SmolLM2's file.
    small = _hf_llama(draft_model_tensors(Path(smollm2_path)),
                      json.loads(shipped_files("draft_model")[1].read_text()))
    ids = torch.tensor([[1, 504, 3575, 282, 4649, 314, 7042]])
    with torch.no_grad():
        small_logits, big_logits = small(ids).logits, big(ids).logits
    assert (big_logits - small_logits).abs().max() <= 1e-4 * small_logits.abs().max()

    for kind in ("eagle", "eagle3"):
        tensors, config = _read(built[kind])
        assert config["hidden_size"] == 2304 and config["num_attention_heads"] == 36
        assert tensors["fc.weight"].dtype == torch.bfloat16
        small_fc = load_shipped_tensors(kind)["fc.weight"]
        assert torch.equal(tensors["fc.weight"][:576, :576], small_fc[:, :576])
        assert torch.count_nonzero(tensors["fc.weight"][576:]).item() == 0
    eagle3_config = _read(built["eagle3"])[1]
    assert eagle3_config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert _read(built["eagle3"])[0]["fc.weight"].shape == (2304, 3 * 2304)
