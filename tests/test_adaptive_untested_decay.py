"""SPECDEC_ADAPTIVE_UNTESTED_DECAY: a draft position that a step did not test fades at its own rate.

Why it exists (adaptive/acceptance.py): at synthetic acceptance 3.0 (positions 1-2 always
accepted, 3-4 never) the default fading made EAGLE-3 draft 3 or 4 tokens in 21% of its batch-1
steps on the H200 (session 62), each two drafter passes more. These tests run the real tracker
and policy on CPU: unset, nothing changes; set, deeper drafts that miss are retried less often,
and drafts still deepen again once the deeper positions start to land.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from specdec_plugin import envs
from specdec_plugin.adaptive.acceptance import AcceptanceSettings, AcceptanceTracker
from specdec_plugin.adaptive.controller import DraftLengthController
from specdec_plugin.adaptive.policy import choose_draft_length

K = 4


class _Batch1Cost:
    """A batch-1 step of the padded 7B on the H200, roughly: a 4.4-ms target forward, and a
    drafter pass of 0.21 ms for each draft plus the prefill pass (BENCHMARKS.md, session 62)."""

    def step_time(self, n: int, k: int) -> float:
        return 4.4 + (0.21 * (k + 1) if k else 0.0)


def _feed(tracker: AcceptanceTracker, rng: np.random.Generator, steps: int) -> None:
    for _ in range(steps):
        for req in rng.choice(["a", "b", "c"], size=rng.integers(1, 4), replace=False):
            drafted = int(rng.integers(0, K + 1))
            tracker.observe(str(req), drafted, int(rng.integers(0, drafted + 1)))
        tracker.end_step()


def test_unset_fades_every_position_as_before():
    """untested_decay=None must be today's arithmetic; setting it to decay itself must give the
    same rates, so the per-position path changes nothing but the untested positions' rate."""
    seed = int(np.random.default_rng().integers(1 << 30))
    trackers = [AcceptanceTracker(AcceptanceSettings(max_k=K, untested_decay=u))
                for u in (None, 0.95)]
    for tracker in trackers:
        _feed(tracker, np.random.default_rng(seed), 60)
    np.testing.assert_allclose(trackers[0].engine_rates(), trackers[1].engine_rates(),
                               rtol=1e-12)
    np.testing.assert_allclose(trackers[0].batch_rates(["a", "b", "c"]),
                               trackers[1].batch_rates(["a", "b", "c"]), rtol=1e-12)


def test_an_untested_position_keeps_its_evidence():
    """After a 4-token draft whose positions 3-4 missed, twenty 2-token drafts that landed: by
    default the misses have faded to 0.95**20 of a test; at 0.99 to 0.99**20."""
    rates = {}
    for u in (None, 0.99):
        tracker = AcceptanceTracker(AcceptanceSettings(max_k=K, untested_decay=u))
        tracker.observe("r", 4, 2)
        tracker.end_step()
        for _ in range(20):
            tracker.observe("r", 2, 2)
            tracker.end_step()
        assert tracker.tested[2] == pytest.approx((0.99 if u else 0.95) ** 20)
        # Tested positions fade as before (their rates move a little with the pooled rate).
        assert tracker.tested[0] == pytest.approx(sum(0.95 ** i for i in range(21)))
        assert tracker.accepted[0] == pytest.approx(tracker.tested[0])
        rates[u] = tracker.batch_rates(["r"])[0]
    assert rates[0.99][2] < rates[None][2] - 0.1  # position 3 still looks as bad as it was


def _run(untested_decay, accepted_before: int, accepted_after: int, steps: int = 425,
         switch_at: int | None = None) -> tuple[Counter, int | None]:
    """The tracker and policy of one request at batch 1: the draft length chosen each step,
    with ``accepted_before`` (then ``accepted_after`` from ``switch_at``) drafts landing."""
    tracker = AcceptanceTracker(AcceptanceSettings(max_k=K, untested_decay=untested_decay))
    lengths, deep_again, drafting = Counter(), None, True
    for step in range(steps):
        after = switch_at is not None and step >= switch_at
        k = choose_draft_length(tracker.batch_rates(["r"]), _Batch1Cost(), range(K + 1),
                                drafting=drafting).k
        drafting = k > 0
        lengths[k] += 1
        if after and k >= 3 and deep_again is None:
            deep_again = step - switch_at
        tracker.observe("r", k, min(k, accepted_after if after else accepted_before))
        tracker.end_step()
    return lengths, deep_again


def test_fewer_deeper_drafts_that_miss():
    """Two positions land, two never do: the default retries 3-4 drafts in more than one step
    of ten; 0.99 in fewer than one of twenty, and both draft 2 otherwise."""
    default, _ = _run(None, 2, 2)
    slow, _ = _run(0.99, 2, 2)
    deeper = {name: sum(n for k, n in lengths.items() if k > 2) / 425
              for name, lengths in (("default", default), ("slow", slow))}
    assert deeper["default"] > 0.10, default
    assert deeper["slow"] < 0.05, slow
    assert default[2] + sum(n for k, n in default.items() if k > 2) == 425
    assert slow[2] > default[2]


def test_drafts_deepen_again_when_deeper_positions_land():
    """The price: once positions 3-4 start landing, the slower fading finds them later, but it
    finds them (no length is given up for good)."""
    _, default_after = _run(None, 2, 4, steps=600, switch_at=200)
    slow_lengths, slow_after = _run(0.99, 2, 4, steps=600, switch_at=200)
    assert default_after is not None and slow_after is not None
    assert default_after <= slow_after <= 60
    assert slow_lengths[4] > 300  # most steps after the change draft 4


def test_the_variable_is_read_and_checked(monkeypatch):
    monkeypatch.delenv("SPECDEC_ADAPTIVE_UNTESTED_DECAY", raising=False)
    assert envs.adaptive_untested_decay() is None
    monkeypatch.setenv("SPECDEC_ADAPTIVE_UNTESTED_DECAY", "0.99")
    assert envs.adaptive_untested_decay() == 0.99
    for bad in ("1.5", "0.1", "often"):
        monkeypatch.setenv("SPECDEC_ADAPTIVE_UNTESTED_DECAY", bad)
        with pytest.raises(ValueError, match="SPECDEC_ADAPTIVE_UNTESTED_DECAY"):
            envs.adaptive_untested_decay()


def test_the_controller_passes_it_to_its_tracker(monkeypatch):
    from specdec_plugin.adaptive.config import controller_settings

    monkeypatch.setenv("SPECDEC_ADAPTIVE_UNTESTED_DECAY", "0.99")
    settings = controller_settings("eagle3")
    assert settings["untested_decay"] == 0.99
    controller = DraftLengthController(K, _Batch1Cost(), **{
        name: value for name, value in settings.items() if name == "untested_decay"})
    assert controller.tracker.settings.untested_decay == 0.99
