"""chat_shift's sets: held-out questions and trained-on questions never overlap, and neither
holds an excluded (evaluation) question."""
from __future__ import annotations

import random

from training.chat_shift import first_by_hash
from training.prompt_sources import is_heldout


def test_trained_and_held_out_sets_split_the_questions():
    rng = random.Random()
    # 2,000 texts, 1 in 40 held out: about 45; none with a chance of about 1e-20.
    texts = [f"Question {rng.randrange(10**9)} about topic {i}?" for i in range(2000)]
    exclude = set(rng.sample(texts, 200))
    held = first_by_hash(texts, 10**6, exclude, held_out=True)
    trained = first_by_hash(texts, 10**6, exclude, held_out=False)
    assert held and trained
    assert not set(held) & set(trained)
    assert not (set(held) | set(trained)) & exclude
    assert set(held) | set(trained) | exclude == set(texts)
    assert all(is_heldout(f"chat/{t}") for t in held)
    assert not any(is_heldout(f"chat/{t}") for t in trained)
    assert first_by_hash(texts, 5, exclude, held_out=False) == trained[:5]
