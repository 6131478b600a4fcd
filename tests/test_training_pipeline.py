"""The issue-17 drafter pipeline end to end on CPU at smoke size (training/README.md):
stage_gen writes shards through a real vLLM engine on our platform, stage_train trains and
exports the four drafters, a resume with zero steps gives back exactly the carried weights,
and eval_acceptance serves the new drafters through the plugin and reports per-position
acceptance. Each stage runs in its own process, as on the device. Acceptance numbers at this
size mean nothing; the test checks that every piece does what the device run relies on."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
LIMIT_PROMPTS, CHAT_SAMPLES, OTHER_SAMPLES, MAX_NEW, HELDOUT = 4, 1, 1, 12, 3


def _env() -> dict:
    return dict(os.environ, SPECDEC_CPU_KV_CACHE_GIB="0.25", PYTHONPATH=str(ROOT))


def _run(module: str, *args: str, timeout: int = 600) -> str:
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout + proc.stderr


class _Background:
    """A stage started now and waited for later (``result``), its output in files: a pipe
    nobody reads while the test runs other stages could fill up and stall it."""

    def __init__(self, module: str, *args: str, log_dir: Path):
        self.out, self.err = log_dir / f"{module}.out", log_dir / f"{module}.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT,
                                         env=_env(), stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, text=True)

    def result(self, timeout: int = 600) -> str:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.kill()
        stdout, stderr = self.out.read_text(), self.err.read_text()
        assert self.proc.returncode == 0, stdout[-3000:] + stderr[-5000:]
        return stdout + stderr

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _eval_args(base: Path) -> list[str]:
    return ["--drafters", str(base / "out1"), "--out", str(base / "eval.json"),
            "--methods", "eagle3,draft_model", "--per-category", "1", "--max-tokens", "8",
            "--categories", "chat,code", "--work", str(base / "evalwork"),
            # Both methods' engines at once (eval_acceptance runs one at a time on a CPU by
            # default): greedy drafts at fixed K do not depend on how busy the cores are.
            "--parallel", "2"]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, smollm2_path, request):
    base = tmp_path_factory.mktemp("pipeline")
    data, out1, out2 = base / "data", base / "out1", base / "out2"
    _run("training.stage_gen", "--data", str(data), "--model", smollm2_path,
         "--max-files", "20", "--workers", "1", "--limit-prompts", str(LIMIT_PROMPTS),
         "--chat-samples", str(CHAT_SAMPLES), "--other-samples", str(OTHER_SAMPLES),
         "--max-new", str(MAX_NEW), "--heldout-count", str(HELDOUT), "--max-num-seqs", "8",
         "--max-prompt", "256")
    common = ["--data", str(data), "--model", smollm2_path, "--cpu", "--token-budget", "192",
              "--max-len", "96", "--eval-seqs", "2"]
    _run("training.stage_train", *common, "--out", str(out1), "--max-steps", "2")
    # The evaluation of the new drafters reads out1 only: it runs while the resume writes out2
    # (each is mostly one-threaded start-up on 2 cores), and its test waits for it.
    evaluation = None
    if any(getattr(item, "originalname", item.name) == _EVAL_TEST
           for item in request.session.items):
        evaluation = _Background("training.eval_acceptance", *_eval_args(base), log_dir=base)
    try:
        _run("training.stage_train", *common, "--out", str(out2), "--init", str(out1),
             "--max-steps", "0")
        yield {"data": data, "out1": out1, "out2": out2, "base": base, "eval": evaluation}
    finally:
        if evaluation is not None:
            evaluation.kill()


def test_gen_writes_shards_with_the_answers(pipeline):
    from training.shards import read_shards, train_shards

    data = pipeline["data"]
    summary = json.loads((data / "gen_summary.json").read_text())
    assert summary["platform"].endswith("SpecDecPlatform")
    shard = read_shards(train_shards(data))
    n = len(shard["offsets"]) - 1
    # Every prompt: one greedy answer plus its samples (chat and others alike at these settings).
    assert n == LIMIT_PROMPTS * (1 + CHAT_SAMPLES) == summary["train"]["finished"]
    assert int(shard["greedy"].sum()) == LIMIT_PROMPTS
    lengths = shard["offsets"][1:] - shard["offsets"][:-1]
    generated = lengths - shard["prompt_lens"]
    assert (generated >= 1).all() and (generated <= MAX_NEW).all()
    assert int(lengths.sum()) == summary["train_shards"]["tokens"] == len(shard["tokens"])
    assert int(generated.sum()) == summary["train"]["generated_tokens"]
    assert summary["train"]["generated_tokens_per_s"] > 0
    held = read_shards([data / "heldout.npz"])
    assert len(held["offsets"]) - 1 == HELDOUT and held["greedy"].all()


def test_train_exports_every_drafter_and_resume_round_trips(pipeline):
    import torch

    from training.drafter_io import find_init_file, load_tensors

    summary = json.loads((pipeline["out1"] / "summary.json").read_text())
    assert summary["train"]["steps"] == 2 and summary["train"]["tokens_seen"] > 0
    for kind in ("eagle3", "eagle", "mtp", "draft_model"):
        result = summary["results"][kind]
        assert not result["resumed"]
        assert result["file"]["bytes"] < 16 * 1024 * 1024
        assert len(result["heldout"]["cum_agreement"]) == 4
        path, config = find_init_file(pipeline["out1"], kind)
        assert config  # the config travels in the metadata
        before, after = load_tensors(path), load_tensors(pipeline["out2"] / f"{kind}.safetensors")
        assert before.keys() == after.keys()
        assert all(torch.equal(before[n], after[n]) for n in before), kind
    resumed = json.loads((pipeline["out2"] / "summary.json").read_text())
    assert all(r["resumed"] for r in resumed["results"].values())
    # Too big for the device's 16 MiB per file in bf16 (4-layer, 192-wide): packed int8.
    assert summary["results"]["draft_model"]["file"]["int8_packed"]


_EVAL_TEST = "test_eval_serves_the_new_drafters_through_the_plugin"


def test_eval_serves_the_new_drafters_through_the_plugin(pipeline):
    # Started by the fixture, next to the resume.
    pipeline["eval"].result()
    report = json.loads((pipeline["base"] / "eval.json").read_text())
    assert report["dtype"] == "float32"
    for kind in ("eagle3", "draft_model"):
        result = report["methods"][kind]
        assert result["platform"].endswith("SpecDecPlatform")
        for cat in ("chat", "code"):
            entry = result["categories"][cat]
            assert entry["drafts"] > 0
            assert len(entry["accepted_per_position"]) == report["k"] == 4
            assert 1.0 <= entry["acceptance_length"] <= 5.0
            # EAGLE-3 alone has a draft vocabulary: the share of the output it holds.
            coverage = entry.get("draft_vocab_coverage")
            assert (0.0 < coverage <= 1.0) if kind == "eagle3" else coverage is None


def test_streamed_target_features_equal_the_stored_capture(smollm2_path):
    """The per-batch features stage_train recomputes are the ones the first pipeline stored:
    residual stream after layers 2/15/27 (= transformers' hidden_states[k]) and the final one
    before/after the last norm, on right-padded rows of different lengths."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from training.data import capture_hidden
    from training.target_features import TargetFeatures, pad_rows

    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    seqs = [list(range(100, 140)), list(range(200, 225))]
    stored = capture_hidden(model, [{"tokens": s, "prompt_len": 5} for s in seqs], "cpu",
                            torch.float32, 8, lambda _: None)
    tokens, lengths = pad_rows([np.array(s) for s in seqs], "cpu")
    streamed = TargetFeatures(model, torch.float32)(tokens, lengths, torch.tensor([5, 5]))
    for key in ("pre", "aux"):
        for row, s in enumerate(seqs):
            assert torch.equal(streamed[key][row, :len(s)], stored[key][row, :len(s)]), key
    with torch.no_grad():
        ref = model(input_ids=tokens[:1], output_hidden_states=True).hidden_states
    # The reference runs one row, the features two padded rows: torch's GEMM may sum in another
    # order per batch shape (on a Xeon it does: 2e-3 apart on SmolLM2's residual stream, whose
    # values reach 2.4e4, 3e-5 after layer 2). Float32 rounding of that, far below the distance
    # to a neighbouring layer (18 between hidden_states[14] and [15]).
    close = dict(rtol=1e-4, atol=1e-3)
    assert torch.allclose(streamed["post"][0], ref[-1][0], **close)
    for j, layer in enumerate((2, 15, 27)):
        got = streamed["aux"][0, :, 576 * j:576 * (j + 1)]
        assert torch.allclose(got, ref[layer][0], **close), layer
        assert not torch.allclose(got, ref[layer - 1][0], **close), layer
