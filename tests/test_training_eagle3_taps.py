"""EAGLE-3 target taps other than vLLM's default (stage_train --eagle3-taps): the features
training reads are the residual stream after k target layers as vLLM counts them, a resumed
head given more taps keeps its drafts, and the config tells vLLM the taps."""
from __future__ import annotations

import pytest
import torch

from training import configs
from training.data import capture_hidden
from training.drafter_io import load_for_resume, save_drafter
from training.heads import Eagle3Head, TargetShape, head_from_tensors, run_chain
from training.stage_train import parse_args, parse_taps
from training.target_features import TargetFeatures

needs_smollm2 = pytest.mark.model  # tests/test_drafters.py's convention


def _tiny_target(layers: int = 4):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                         max_position_embeddings=128)
    return LlamaForCausalLM(config).float().eval()


def _tokens(rows: int = 3, length: int = 11):
    tokens = torch.randint(3, 300, (rows, length))
    lengths = torch.tensor([length, length - 4, length - 2][:rows])
    return tokens, lengths, torch.full((rows,), 2)


def _layer_outputs(model, tokens):
    with torch.no_grad():
        out = model.model(input_ids=tokens, output_hidden_states=True)
    # hidden_states[k] is the residual stream after k layers, except the last entry, which
    # transformers returns after the final norm.
    return out.hidden_states


def test_taps_count_layers_as_vllm_does():
    model = _tiny_target()
    tokens, lengths, prompt_lens = _tokens()
    features = TargetFeatures(model, torch.float32, (1, 2, 4))
    got = features(tokens, lengths, prompt_lens)
    features.close()
    hidden = _layer_outputs(model, tokens)
    d = 64
    torch.testing.assert_close(got["aux"][..., :d], hidden[1])
    torch.testing.assert_close(got["aux"][..., d:2 * d], hidden[2])
    # After all 4 layers: the last layer's output before the final norm, i.e. "pre".
    torch.testing.assert_close(got["aux"][..., 2 * d:], got["pre"])
    # The held-out capture reads the same taps the same way.
    seqs = [{"tokens": tokens[i, :int(lengths[i])].tolist(), "prompt_len": 2} for i in range(3)]
    held = capture_hidden(model, seqs, "cpu", torch.float32, batch_size=2, log=lambda m: None,
                          aux_layers=(1, 2, 4))
    for i in range(3):
        n = int(lengths[i])
        torch.testing.assert_close(held["aux"][i, :n], got["aux"][i, :n], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        TargetFeatures(model, torch.float32, (0, 2, 4))
    with pytest.raises(ValueError):
        TargetFeatures(model, torch.float32, (1, 2, 5))


def test_closed_features_leave_no_hooks():
    model = _tiny_target()
    features = TargetFeatures(model, torch.float32, (1, 2, 3))
    features.close()
    assert all(not layer._forward_hooks for layer in model.model.layers)


def test_added_taps_keep_the_drafts_and_get_gradients():
    shape = TargetShape(hidden=64, n_heads=4, n_kv=2, head_dim=16, inter=96, vocab=300)
    head = Eagle3Head(shape, 40, torch.arange(90), aux_layers=(1, 2, 3)).eval()
    old = torch.randn(2, 9, 3 * 64)
    extra = torch.randn(2, 9, 64)
    emb = torch.randn(2, 9, 64)
    want = [out for _, out in run_chain(head, {"aux": old}, emb, None, 3)]
    head.add_taps((1, 2, 3, 4))
    assert head.aux_layers == (1, 2, 3, 4) and head.fc.in_features == 4 * 64
    got = run_chain(head, {"aux": torch.cat((old, extra), dim=-1)}, emb, None, 3)
    for a, (_, b) in zip(want, got):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
    sum(out.square().sum() for _, out in got).backward()
    assert head.fc.weight.grad[:, 3 * 64:].abs().sum() > 0
    # A tap in the middle: the old columns move with their taps.
    head2 = Eagle3Head(shape, 40, torch.arange(90), aux_layers=(1, 3, 4)).eval()
    x = torch.randn(2, 9, 3 * 64)
    want = head2.first_hidden({"aux": x})
    head2.add_taps((1, 2, 3, 4))
    wide = torch.cat((x[..., :64], torch.randn(2, 9, 64), x[..., 64:]), dim=-1)
    torch.testing.assert_close(head2.first_hidden({"aux": wide}), want, rtol=1e-6, atol=1e-6)
    for bad in ((1, 2), (2, 1, 3, 4), (1, 2, 2, 3)):
        with pytest.raises(ValueError):
            head2.add_taps(bad)


def test_taps_travel_in_the_config_and_back(tmp_path):
    shape = TargetShape()
    head = Eagle3Head(shape, 32, torch.arange(192), aux_layers=(2, 15, 27, 30))
    save_drafter("eagle3", head, tmp_path / "eagle3.safetensors")
    resumed = load_for_resume(tmp_path, "eagle3", None, log=lambda m: None)
    assert resumed.aux_layers == (2, 15, 27, 30) and resumed.fc.in_features == 4 * 576
    config = configs.eagle3_config(aux_layers=(2, 15, 27, 30))
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27, 30]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27, 30]
    # Without the config's taps a 4-tap file is refused rather than read as 3.
    with pytest.raises(ValueError):
        head_from_tensors("eagle3", head.export_tensors(), shape)
    # The default taps are vLLM's own default: the shipped config needs no top-level key.
    assert "eagle_aux_hidden_state_layer_ids" not in configs.eagle3_config()


def test_stage_train_checks_the_taps():
    assert parse_taps("2,15,27,30") == (2, 15, 27, 30)
    assert parse_args(["--data", "d", "--out", "o", "--eagle3-taps", "2,15,30"]).eagle3_taps \
        == (2, 15, 30)
    assert parse_args(["--data", "d", "--out", "o"]).eagle3_taps is None
    for bad in ("15,2,30", "0,15,30", "2,15,31", "2,x,30", "2,15,15"):
        with pytest.raises(SystemExit):
            parse_args(["--data", "d", "--out", "o", "--eagle3-taps", bad])


@needs_smollm2
def test_vllm_reads_the_taps_from_our_config(tmp_path):
    """vLLM 0.26 reads an EAGLE-3 head's taps from one top-level config key only."""
    import json
    import shutil

    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
        get_eagle3_aux_layers_from_config)

    from specdec_plugin.models import drafters

    assets = tmp_path / "assets"
    (assets / "eagle3").mkdir(parents=True)
    shipped = drafters.ASSETS_DIR / "eagle3"
    shutil.copyfile(shipped / "model.safetensors", assets / "eagle3" / "model.safetensors")
    config = json.loads((shipped / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [2, 15, 30]
    (assets / "eagle3" / "config.json").write_text(json.dumps(config))
    spec = drafters.speculative_config("eagle3", 3, cache_dir=tmp_path / "cache",
                                       assets_dir=assets)
    engine = EngineArgs(model=str(drafters.target_for("eagle3")), speculative_config=spec,
                        dtype="float32", max_model_len=1024).create_engine_config()
    assert get_eagle3_aux_layers_from_config(engine.speculative_config) == (2, 15, 30)
