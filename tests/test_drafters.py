"""The shipped SmolLM2-135M drafters (specdec_plugin.models.drafters): that vLLM 0.26 accepts
each checkpoint directory (config parsers, model classes, every weight name), and that each
drafter actually agrees with the target on text the target writes greedily."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_plugin.models import drafters

needs_smollm2 = pytest.mark.model

PROMPTS = [
    ("chat", "Explain how a rainbow forms in simple terms."),
    ("code", 'def is_palindrome(text: str) -> bool:\n    """Return True if text reads the same '
             'backwards, ignoring case and spaces."""\n'),
]
CONTINUATION = 40

# Measured on these prompts (CPU, fp32, 72 chain starts) when the bounds were set: draft_model
# 0.36, eagle 0.46, eagle3 0.49, mtp 0.50 (bf16); after int8 packing 0.36 / 0.46 / 0.47 / 0.51
# (training/README.md); an untrained drafter scores ~0. Session 35's draft model (four of the
# target's layers, trained) reads 0.42.
MIN_DEPTH1_AGREEMENT = {"draft_model": 0.30, "eagle": 0.35, "eagle3": 0.35, "mtp": 0.35}

EXPECTED_DRAFT_ARCH = {"draft_model": "LlamaForCausalLM", "eagle": "EagleLlamaForCausalLM",
                       "eagle3": "Eagle3LlamaForCausalLM", "mtp": "MiMoMTPModel"}


def test_shipped_files_exist_and_stay_small():
    total = 0
    for kind in drafters.KINDS:
        weights, config = drafters.shipped_files(kind)
        assert weights.stat().st_size > 1_000_000, weights
        json.loads(config.read_text())
        total += weights.stat().st_size
    # int8-packed: 29.7 MB since session 17 (EAGLE-3's 16,320-token head); issue 17 asks for
    # the set to stay under about 40 MB.
    assert total < 40_000_000, f"shipped drafters grew to {total} bytes"


@pytest.mark.parametrize("kind", drafters.KINDS)
def test_shipped_matrices_are_packed_int8(kind):
    """Every matrix ships as int8 + one fp16 scale per row; small tensors ship as trained."""
    import torch
    from safetensors import safe_open

    weights, _ = drafters.shipped_files(kind)
    with safe_open(str(weights), "pt") as handle:
        assert handle.metadata()["specdec_format"] == drafters.PACKED_FORMAT
        raw = {name: handle.get_tensor(name) for name in handle.keys()}
    packed = [n[:-len(drafters.QWEIGHT_SUFFIX)] for n in raw if n.endswith(".qweight")]
    assert packed
    for base in packed:
        qweight, scale = raw[base + ".qweight"], raw[base + ".scale"]
        assert qweight.dtype == torch.int8 and scale.dtype == torch.float16
        assert scale.shape == (qweight.shape[0],) and (scale > 0).all()
        assert qweight.abs().max().item() == 127  # absmax/127 scaling uses the full range
    plain = {n: t for n, t in raw.items() if not n.endswith((".qweight", ".scale"))}
    assert all(t.dim() == 1 for t in plain.values()), sorted(plain)
    restored = drafters.load_shipped_tensors(kind)
    assert set(restored) == set(plain) | set(packed)
    assert all(restored[n].dtype == torch.bfloat16 for n in packed)
    assert all(torch.equal(restored[n], t) for n, t in plain.items())


def test_rowwise_int8_round_trip_is_within_half_a_step():
    import torch

    from training.pack_int8 import quantize_rowwise

    weight = torch.randn(64, 300) * torch.logspace(-2, 1, 64)[:, None]
    weight[3] = 0.0  # an all-zero row must survive (scale 0)
    qweight, scale = quantize_rowwise(weight)
    restored = drafters.dequantize_rowwise(qweight, scale, torch.float32)
    step = scale.float()[:, None]
    assert ((restored - weight).abs() <= 0.5 * step + 1e-3 * step + 1e-12).all()
    assert torch.equal(restored[3], torch.zeros(300))
    rows_absmax = weight.abs().amax(dim=1)
    assert torch.allclose(scale.float(), rows_absmax / 127, rtol=1e-3)


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="unknown drafter kind"):
        drafters.drafter_checkpoint("medusa")


def test_mimo_config_is_qwen2_with_one_mtp_layer():
    target = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "mlp_bias": False,
              "num_hidden_layers": 30, "hidden_size": 576, "tie_word_embeddings": True}
    config = drafters.mimo_config(target, {"num_nextn_predict_layers": 1})
    assert config["architectures"] == ["MiMoForCausalLM"]
    assert config["model_type"] == "qwen2" and config["num_nextn_predict_layers"] == 1
    assert "mlp_bias" not in config and config["max_window_layers"] == 30


@needs_smollm2
@pytest.mark.parametrize("kind", drafters.KINDS)
def test_vllm_engine_config_accepts_drafter(kind):
    from vllm.engine.arg_utils import EngineArgs

    spec = drafters.speculative_config(kind, 1 if kind == "mtp" else 3)
    config = EngineArgs(model=str(drafters.target_for(kind)), speculative_config=spec,
                        dtype="float32", max_model_len=1024).create_engine_config()
    draft = config.speculative_config.draft_model_config
    assert config.speculative_config.method == kind
    assert draft.architectures == [EXPECTED_DRAFT_ARCH[kind]]
    if kind == "eagle3":
        assert draft.hf_config.draft_vocab_size == 16320
        assert list(draft.hf_config.eagle_config["eagle_aux_hidden_state_layer_ids"]) == [2, 15, 27]


# Runs in its own process: it initializes torch.distributed, which must not leak into the
# engines other tests start.
_LOAD_SCRIPT = r"""
import json, sys, torch
from pathlib import Path
from safetensors.torch import load_file
from vllm.config import set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader.utils import get_model_architecture
from specdec_plugin.models import drafters

report, ready = {}, False
for kind in drafters.KINDS:
    spec = drafters.speculative_config(kind, 1)
    cfg = EngineArgs(model=str(drafters.target_for(kind)), speculative_config=spec,
                     dtype="float32", max_model_len=1024).create_engine_config()
    draft = cfg.speculative_config.draft_model_config
    cls, _ = get_model_architecture(draft)
    if kind == "draft_model":  # a plain model: build it under its own model config
        import copy
        cfg = copy.copy(cfg)
        cfg.model_config = draft
    with set_current_vllm_config(cfg):
        if not ready:
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method="tcp://127.0.0.1:" + sys.argv[1])
            initialize_model_parallel(1, 1)
            ready = True
        model = cls(vllm_config=cfg, prefix="")
    for p in model.parameters():
        if p.is_floating_point():
            p.data.fill_(float("nan"))
    tensors = load_file(str(Path(draft.model) / "model.safetensors"))
    model.load_weights(iter(tensors.items()))
    unloaded = sorted(n for n, p in model.named_parameters()
                      if p.is_floating_point() and torch.isnan(p).any())
    entry = {"unloaded": unloaded,
             "own_embed": getattr(model, "has_own_embed_tokens", None),
             "own_lm_head": getattr(model, "has_own_lm_head", None)}
    if kind == "eagle3":
        entry["d2t_ok"] = bool(torch.equal(model.draft_id_to_target_id.cpu(), tensors["d2t"]))
    report[kind] = entry
print("REPORT " + json.dumps(report))
"""


@needs_smollm2
def test_vllm_model_classes_load_every_weight():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    for kind in drafters.KINDS:  # build the cached dirs here, so the child only reads
        drafters.drafter_checkpoint(kind)
    done = subprocess.run([sys.executable, "-c", _LOAD_SCRIPT, port], capture_output=True,
                          text=True, timeout=600, cwd=Path(__file__).resolve().parent.parent)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("REPORT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    report = json.loads(lines[-1][len("REPORT "):])
    # EAGLE heads take embed_tokens (and EAGLE-1 the lm_head) from the target at load time:
    # those stay unloaded here, and nothing else may.
    assert report["eagle"] == {"unloaded": ["model.embed_tokens.weight"], "own_embed": False,
                               "own_lm_head": False}
    assert report["eagle3"]["unloaded"] == ["model.embed_tokens.weight"]
    assert report["eagle3"]["own_lm_head"] is True and report["eagle3"]["d2t_ok"] is True
    assert report["mtp"]["unloaded"] == [] and report["draft_model"]["unloaded"] == []


@pytest.fixture(scope="module")
def greedy_data():
    """Target, its greedy continuations of PROMPTS, and their hidden states (fp32, CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.data import capture_hidden

    path = drafters.fetch_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(path)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    seqs = []
    for kind, text in PROMPTS:
        if kind == "chat":
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                 tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            out = target.generate(ids, max_new_tokens=CONTINUATION, do_sample=False,
                                  eos_token_id=None, pad_token_id=2)
        seqs.append({"tokens": out[0].tolist(), "prompt_len": ids.shape[1], "greedy": True})
    data = capture_hidden(target, seqs, "cpu", torch.float32, batch_size=4, log=lambda m: None)
    data["greedy"] = torch.ones(len(seqs), dtype=torch.bool)
    return target, data


def _agreement(kind, model, target, data):
    from training.data import target_norm
    from training.train import eval_agreement

    return eval_agreement(kind, model, data, list(range(len(PROMPTS))),
                          target.model.embed_tokens.weight.detach(),
                          lambda x: target_norm(target, x), contextlib.nullcontext, 4)


@needs_smollm2
def test_draft_model_agrees_with_target(greedy_data):
    import torch
    from transformers import AutoModelForCausalLM

    target, data = greedy_data
    draft = AutoModelForCausalLM.from_pretrained(drafters.drafter_checkpoint("draft_model"),
                                                 dtype=torch.float32).eval()
    assert draft.config.vocab_size == target.config.vocab_size
    result = _agreement("draft_model", draft, target, data)
    print("draft_model", result)
    assert result["cum_agreement"][0] >= MIN_DEPTH1_AGREEMENT["draft_model"], result


@needs_smollm2
@pytest.mark.parametrize("kind", ["eagle", "eagle3", "mtp"])
def test_head_agrees_with_target(greedy_data, kind):
    """The shipped tensors (dequantized), under vLLM's names, in the training-time head."""
    from training.heads import head_from_tensors

    target, data = greedy_data
    head = head_from_tensors(kind, drafters.load_shipped_tensors(kind))
    result = _agreement(kind, head, target, data)
    print(kind, result)
    assert result["cum_agreement"][0] >= MIN_DEPTH1_AGREEMENT[kind], result
    # A chain must not collapse after its first token either.
    assert result["cum_agreement"][1] > 0.05, result


@needs_smollm2
def test_mimo_checkpoint_computes_the_target(greedy_data):
    """The MiMo build (Qwen2 names, zero biases) gives SmolLM2's logits under transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    target, data = greedy_data
    mimo = AutoModelForCausalLM.from_pretrained(drafters.drafter_checkpoint("mtp"),
                                                dtype=torch.float32).eval()
    assert type(mimo).__name__ == "Qwen2ForCausalLM"
    ids = data["tokens"][:1, :24]
    with torch.no_grad():
        want = target(input_ids=ids).logits
        got = mimo(input_ids=ids).logits
    assert (got - want).abs().max().item() < 1e-3
