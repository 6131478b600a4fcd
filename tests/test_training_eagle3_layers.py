"""EAGLE-3 heads of more than one decoder layer in training (heads.Eagle3Head): a head grown
from a trained one starts as the same function, its new layer learns, and the file it exports
is what vLLM 0.26's multi-layer llama_eagle3 reads (``midlayer.*`` then ``layers.N.*``)."""
from __future__ import annotations

import pytest
import torch

from training import configs
from training.drafter_io import drafter_tensors
from training.heads import Eagle3Head, TargetShape, eagle3_num_layers, head_from_tensors, run_chain

SHAPE = TargetShape(hidden=64, n_heads=4, n_kv=2, head_dim=16, inter=96, vocab=300)


def _head(num_layers: int = 1) -> Eagle3Head:
    ids = torch.sort(torch.randperm(SHAPE.vocab)[:90]).values
    head = Eagle3Head(SHAPE, 40, ids, num_layers=num_layers)
    with torch.no_grad():  # norms away from their ones, so a misplaced norm shows
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return head.eval()


def _batch(length: int = 9):
    return {"aux": torch.randn(2, length, 3 * SHAPE.hidden)}, torch.randn(2, length, SHAPE.hidden)


def _chain(head, steps: int = 3):
    batch, emb = _batch()
    return [logits for _, logits in run_chain(head, batch, emb, None, steps)], (batch, emb)


def test_grown_head_keeps_its_drafts_and_its_new_layer_learns():
    head = _head()
    batch, emb = _batch()
    before = [out for _, out in run_chain(head, batch, emb, None, 3)]
    head.grow(2)
    assert head.attention_layers == 2
    after = run_chain(head, batch, emb, None, 3)
    for want, (_, got) in zip(before, after):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    # The zeroed projections get gradients (the rest of the layer is random, not zero).
    sum(out.square().sum() for _, out in after).backward()
    layer = head.extra_layers[0]
    assert layer.self_attn.o_proj.weight.grad.abs().sum() > 0
    assert layer.mlp.down_proj.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError):
        head.grow(1)


def test_second_layer_changes_every_chain_step():
    """A live second layer is on the path of every step, not only the first."""
    head = _head(2)
    want, (batch, emb) = _chain(head)
    with torch.no_grad():
        head.extra_layers[0].mlp.down_proj.weight.mul_(2)
    got = [out for _, out in run_chain(head, batch, emb, None, 3)]
    for a, b in zip(want, got):
        assert (a - b).abs().max() > 1e-3


def test_export_names_and_round_trip():
    head = _head(3)
    tensors = head.export_tensors()
    assert eagle3_num_layers(tensors) == 3
    for i in (1, 2):
        for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm",
                     "self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj"):
            assert f"layers.{i}.{name}.weight" in tensors
        # Layers after the first read hidden_size inputs (vLLM: qkv_input_size).
        assert tensors[f"layers.{i}.self_attn.q_proj.weight"].shape[1] == SHAPE.hidden
        assert torch.equal(tensors[f"layers.{i}.hidden_norm.weight"], torch.ones(SHAPE.hidden))
    assert tensors["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * SHAPE.hidden
    assert not any(k.startswith(("extra_layers", "layers.0.")) for k in tensors)

    rebuilt = head_from_tensors("eagle3", tensors, SHAPE)
    assert rebuilt.attention_layers == 3
    batch, emb = _batch()
    want = run_chain(head, batch, emb, None, 3)
    got = run_chain(rebuilt, batch, emb, None, 3)
    for (_, a), (_, b) in zip(want, got):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_one_layer_head_exports_as_before():
    tensors = _head(1).export_tensors()
    assert eagle3_num_layers(tensors) == 1
    assert not any(k.startswith("layers.") for k in tensors)


def test_config_counts_the_layers():
    head = _head(2)
    _, config = drafter_tensors("eagle3", head)
    assert config["num_hidden_layers"] == 2
    assert config["intermediate_size"] == 40
    assert configs.eagle3_config()["num_hidden_layers"] == 1


def test_stage_train_rejects_zero_layers():
    from training.stage_train import parse_args

    assert parse_args(["--data", "d", "--out", "o", "--eagle3-layers", "2"]).eagle3_layers == 2
    with pytest.raises(SystemExit):
        parse_args(["--data", "d", "--out", "o", "--eagle3-layers", "0"])
