"""stage_train --revocab: a resumed EAGLE-3 head gets a new draft vocabulary and keeps what it
learned. Its layers are unchanged, so for every token in both vocabularies its logit is the old
head's, on random inputs; new tokens' rows start from the target's embedding."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from training.heads import Eagle3Head, TargetShape
from training.stage_train import revocab_eagle3


def _tiny_target(shape: TargetShape):
    embed = torch.nn.Embedding(shape.vocab, shape.hidden)
    norm = SimpleNamespace(weight=torch.rand(shape.hidden) + 0.5)
    return SimpleNamespace(model=SimpleNamespace(embed_tokens=embed, norm=norm))


def test_revocab_keeps_layers_and_shared_rows():
    shape = TargetShape(hidden=64, n_heads=4, n_kv=2, head_dim=16, inter=96, vocab=500)
    old_ids = torch.sort(torch.randperm(shape.vocab)[:120]).values
    old = Eagle3Head(shape, 48, old_ids)
    with torch.no_grad():
        for p in old.parameters():
            p.normal_()
    new_ids = torch.sort(torch.cat([old_ids[::2], torch.tensor(
        sorted(set(range(shape.vocab)) - set(old_ids.tolist()))[:90])])).values
    target = _tiny_target(shape)
    new = revocab_eagle3(old, new_ids, target, shape)

    assert torch.equal(new.vocab_ids, new_ids)
    for name, value in old.state_dict().items():
        if not name.startswith("lm_head."):
            assert torch.equal(new.state_dict()[name], value), name
    hidden = torch.randn(5, shape.hidden)
    old_logits, new_logits = old.lm_head(old.norm(hidden)), new.lm_head(new.norm(hidden))
    old_col = {int(t): i for i, t in enumerate(old_ids)}
    for j, t in enumerate(new_ids.tolist()):
        if t in old_col:
            # The row itself is the old head's, bit for bit; its logits agree up to the float
            # rounding of two matrix products of different widths (allclose's default atol of
            # 1e-8 failed about 1 run in 130 on near-zero logits).
            assert torch.equal(new.lm_head.weight[j], old.lm_head.weight[old_col[t]]), t
            torch.testing.assert_close(new_logits[:, j], old_logits[:, old_col[t]])
        else:
            assert torch.equal(new.lm_head.weight[j], target.model.embed_tokens.weight[t].detach()), t
    shared = sum(int(t) in old_col for t in new_ids)
    assert 0 < shared < len(new_ids)  # both kinds of rows were checked
