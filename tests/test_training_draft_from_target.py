"""A draft model cut from SmolLM2's own layers (training/draft_from_target.py), its export without
the target's embedding and its way back (resume, and the checkpoint vLLM loads); and MLP.widen,
which grows a resumed EAGLE-3 head without changing its output."""
from __future__ import annotations

import json

import pytest
import torch

from training import draft_from_target
from training.drafter_io import load_for_resume, save_drafter
from training.heads import Eagle3Head, TargetShape, head_from_tensors
from training.stage_train import parse_args


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.fixture(scope="module")
def target(smollm2_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()


def test_all_thirty_layers_compute_the_target(target):
    ids = torch.randint(0, 49152, (2, 12))
    whole = draft_from_target.build(target, list(range(30))).eval()
    torch.testing.assert_close(_logits(whole, ids), _logits(target, ids), rtol=1e-4, atol=1e-4)


def test_a_subset_ships_without_the_embedding_and_comes_back(target, smollm2_path, tmp_path):
    from safetensors import safe_open

    from specdec_plugin.models.drafters import drafter_checkpoint

    draft = draft_from_target.build(target, [0, 29]).eval()
    emb = target.model.embed_tokens.weight
    assert not draft.model.embed_tokens.weight.requires_grad
    assert draft.lm_head.weight.data_ptr() == draft.model.embed_tokens.weight.data_ptr()
    trainable = {n for n, p in draft.named_parameters() if p.requires_grad}
    assert trainable and not any("embed_tokens" in n or "lm_head" in n for n in trainable)
    with torch.no_grad():  # as if trained: the copy must carry these weights, not the target's
        for p in draft.model.layers.parameters():
            p.add_(torch.randn_like(p) * 0.01)

    info = save_drafter("draft_model", draft, tmp_path / "draft_model.safetensors")
    with safe_open(str(tmp_path / "draft_model.safetensors"), "pt") as handle:
        names = set(handle.keys())
        config = json.loads(handle.metadata()["config"])
    assert draft_from_target.EMBEDDING not in names and "lm_head.weight" not in names
    assert not info["int8_packed"]
    assert (config["hidden_size"], config["num_hidden_layers"]) == (576, 2)

    ids = torch.randint(0, 49152, (2, 10))
    with torch.no_grad():  # what the bf16 file holds (parameters only: rotary tables stay fp32)
        for p in draft.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    want = _logits(draft, ids)

    with pytest.raises(ValueError, match="target_embedding"):
        load_for_resume(tmp_path, "draft_model", config, print)
    resumed = load_for_resume(tmp_path, "draft_model", config, print,
                              target_embedding=emb.to(torch.bfloat16).float())
    assert draft_from_target.shares_target_embedding(resumed)
    torch.testing.assert_close(_logits(resumed.eval(), ids), want, rtol=1e-5, atol=1e-5)

    # The shipped layout, materialized for vLLM: the embedding comes from SmolLM2's checkpoint.
    assets = tmp_path / "assets"
    (assets / "draft_model").mkdir(parents=True)
    (tmp_path / "draft_model.safetensors").rename(assets / "draft_model" / "model.safetensors")
    (assets / "draft_model" / "config.json").write_text(json.dumps(config))
    checkpoint = drafter_checkpoint("draft_model", cache_dir=tmp_path / "cache", assets_dir=assets)
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as handle:
        assert draft_from_target.EMBEDDING in set(handle.keys())
    torch.testing.assert_close(_logits(loaded, ids), want, rtol=1e-4, atol=1e-4)


def test_widened_eagle3_mlp_keeps_the_output_and_exports_its_width():
    shape = TargetShape(hidden=64, n_heads=4, n_kv=2, head_dim=16, inter=96, vocab=300)
    ids = torch.sort(torch.randperm(shape.vocab)[:90]).values
    head = Eagle3Head(shape, 40, ids).eval()
    x = torch.randn(3, 7, shape.hidden)
    before = head.mlp(x)
    head.mlp.widen(72)
    after = head.mlp(x)
    assert head.mlp.gate_proj.weight.shape == (72, shape.hidden)
    assert head.mlp.down_proj.weight.shape == (shape.hidden, 72)
    torch.testing.assert_close(after, before, rtol=1e-6, atol=1e-6)
    # The new units are live: a gradient reaches their down_proj columns.
    head.mlp(x).square().sum().backward()
    assert head.mlp.down_proj.weight.grad[:, 40:].abs().sum() > 0
    with pytest.raises(ValueError):
        head.mlp.widen(30)

    rebuilt = head_from_tensors("eagle3", head.export_tensors(), shape)
    assert rebuilt.mlp.gate_proj.out_features == 72
    torch.testing.assert_close(rebuilt.mlp(x), after, rtol=1e-6, atol=1e-6)


def test_stage_train_checks_the_layer_ids():
    args = parse_args(["--data", "d", "--out", "o", "--draft-from-target", "0,10,20,29"])
    assert args.draft_layer_ids == [0, 10, 20, 29]
    for bad in ("3,1", "0,30", "2,2"):
        with pytest.raises(SystemExit):
            parse_args(["--data", "d", "--out", "o", "--draft-from-target", bad])
