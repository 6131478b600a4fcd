"""stage_train's loss options for the heads: --answer-only counts only the drafts an engine
makes (chains that start inside the answer), --label-temperature sharpens the target's
distribution. Random inputs, a tiny EAGLE-3 head, no model download."""
from __future__ import annotations

import contextlib

import pytest
import torch

from training.heads import Eagle3Head, TargetShape, run_chain
from training.stage_train import parse_args
from training.train import head_loss

SHAPE = TargetShape(hidden=64, n_heads=4, n_kv=2, head_dim=16, inter=96, vocab=300)
STEPS = 3


def _batch(rows: int = 3, width: int = 14):
    tokens = torch.randint(3, SHAPE.vocab, (rows, width))
    lengths = torch.tensor([width, width - 3, width - 1][:rows])
    prompt_lens = torch.tensor([5, 7, 4][:rows])
    pre = torch.randn(rows, width, SHAPE.hidden)
    return {"tokens": tokens, "lengths": lengths, "prompt_lens": prompt_lens, "pre": pre,
            "post": torch.randn(rows, width, SHAPE.hidden),
            "aux": torch.randn(rows, width, 3 * SHAPE.hidden)}


def _embedding(scale: float = 1.0):
    # At scale 1 the target's logits have a spread of about 8 (64 unit features): peaked
    # distributions, as a trained target's mostly are.
    return torch.randn(SHAPE.vocab, SHAPE.hidden) * scale


def _head():
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    head = Eagle3Head(SHAPE, 40, torch.arange(SHAPE.vocab), aux_layers=(1, 2, 3)).eval()
    with torch.no_grad():
        # Logits as spread as a trained head's, so that a change of labels moves the loss
        # well beyond float rounding (an untrained head's are nearly flat).
        head.lm_head.weight.mul_(8)
    return head


def _loss(head, b, emb, **kw):
    with torch.no_grad():
        loss, _ = head_loss(head, b, emb, STEPS, contextlib.nullcontext, **kw)
    return float(loss)


def test_answer_only_ignores_the_targets_of_chains_started_in_the_prompt():
    head, b, emb = _head(), _batch(), _embedding()
    # The target's distribution for position q+1's next token comes from post[:, q+1]. A chain
    # started at s drafts only if s + 1 >= prompt_len, so its step j reads post at s+j+1 >=
    # prompt_len: labels at post positions before the prompt's end belong to no engine draft.
    # (EAGLE-3's inputs are the taps, "aux", so post is read only as labels.)
    changed = dict(b, post=b["post"].clone())
    for row, p in enumerate(b["prompt_lens"].tolist()):
        changed["post"][row, :p] = torch.randn(p, SHAPE.hidden) * 3
    assert _loss(head, changed, emb, answer_only=True) == pytest.approx(
        _loss(head, b, emb, answer_only=True), rel=1e-6)
    # Without the option those labels are trained on, so the loss moves.
    assert _loss(head, changed, emb) != pytest.approx(_loss(head, b, emb), rel=1e-5)
    # And the labels inside the answers move it.
    inside = dict(b, post=b["post"].clone())
    for row, p in enumerate(b["prompt_lens"].tolist()):
        inside["post"][row, p:] = torch.randn(inside["post"].shape[1] - p, SHAPE.hidden) * 3
    assert _loss(head, inside, emb, answer_only=True) != pytest.approx(
        _loss(head, b, emb, answer_only=True), rel=1e-5)


def test_answer_only_counts_each_step_over_the_engines_chain_starts():
    head, b, emb = _head(), _batch(), _embedding()
    with torch.no_grad():
        _, parts = head_loss(head, b, emb, STEPS, contextlib.nullcontext, answer_only=True)
        inputs = {"aux": b["aux"][:, :-1]}
        outs = run_chain(head, inputs, torch.nn.functional.embedding(b["tokens"][:, 1:], emb),
                         emb, STEPS)
        probs = torch.softmax(b["post"][:, 1:] @ emb.T, -1)
    # An engine drafts from s = prompt_len - 1 on (the first verified token is the target's
    # own); draft j of a chain from s sits at q = s + j and is trained while post[q + 1] is a
    # real position.
    for j, (_, logits) in enumerate(outs):
        ces = []
        for row in range(b["tokens"].shape[0]):
            p, n = int(b["prompt_lens"][row]), int(b["lengths"][row])
            for s in range(p - 1, n):
                q = s + j
                if q + 1 < n:
                    ces.append(torch.logsumexp(logits[row, q], -1)
                               - (probs[row, q] * logits[row, q]).sum())
        assert float(parts[j]) == pytest.approx(float(torch.stack(ces).mean()), rel=1e-5)


def test_label_temperature_is_the_target_logits_divided_by_t():
    # Logits with a spread of about 1, so that halving T changes the labels a lot (peaked ones
    # are one-hot at any T and would not tell T from no T).
    head, b, emb = _head(), _batch(), _embedding(1 / 8)
    # The target's LM head is linear without bias: logits(post / T) = logits(post) / T.
    scaled = dict(b, post=b["post"] / 0.5)
    assert _loss(head, b, emb, label_temperature=0.5) == pytest.approx(
        _loss(head, scaled, emb), rel=1e-5)
    # Ignoring T would compute the T=1 loss bit for bit.
    assert _loss(head, b, emb, label_temperature=0.5) != _loss(head, b, emb)
    assert _loss(head, b, emb, label_temperature=1.0) == _loss(head, b, emb)


def test_stage_train_parses_the_options_and_rejects_a_bad_temperature(tmp_path, capsys):
    args = parse_args(["--data", str(tmp_path), "--out", str(tmp_path), "--answer-only",
                       "--label-temperature", "0.5"])
    assert args.answer_only and args.label_temperature == 0.5
    default = parse_args(["--data", str(tmp_path), "--out", str(tmp_path)])
    assert not default.answer_only and default.label_temperature == 1.0
    with pytest.raises(SystemExit):
        parse_args(["--data", str(tmp_path), "--out", str(tmp_path), "--label-temperature", "0"])
    assert "--label-temperature" in capsys.readouterr().err
