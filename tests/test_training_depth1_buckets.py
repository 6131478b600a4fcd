"""training/depth1_by_confidence.py's buckets: shares and agreements against a count by hand,
on fresh random predictions."""
from __future__ import annotations

import numpy as np

from training.depth1_by_confidence import BUCKETS, by_bucket


def test_buckets_count_shares_and_agreement_by_hand():
    rng = np.random.default_rng()
    n = int(rng.integers(50, 400))
    hits, top1 = rng.random(n) < 0.6, rng.random(n)
    mask = rng.random(n) < 0.5
    for keep in (None, mask):
        rows = by_bucket(hits, top1, keep)
        assert len(rows) == len(BUCKETS) - 1
        assert abs(sum(r["share"] for r in rows) - 1.0) < 1e-3
        for row in rows:
            lo, hi = row["p_top1"]
            inside = (top1 >= lo) & (top1 < (hi if hi < 1.0 else 1.01))
            chosen = inside & (True if keep is None else keep)
            assert row["share"] == round(float(inside.mean()), 4)
            expected = round(float(hits[chosen].mean()), 4) if chosen.any() else None
            assert row["agreement"] == expected


def test_a_bucket_with_nothing_kept_has_no_agreement():
    rows = by_bucket(np.array([True, False]), np.array([0.95, 0.97]), np.array([False, False]))
    assert all(r["agreement"] is None for r in rows)
    assert rows[-1]["share"] == 1.0
