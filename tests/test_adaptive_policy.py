"""The adaptive controller's decisions, without an engine: acceptance history and a cost table
in, draft length out (specdec_plugin/adaptive/)."""
from __future__ import annotations

import numpy as np
import pytest

from specdec_plugin.adaptive.acceptance import AcceptanceSettings, AcceptanceTracker
from specdec_plugin.adaptive.controller import DraftLengthController
from specdec_plugin.adaptive.cost_model import SPEC_STEP_OVERHEAD, CostTable, fallback_table
from specdec_plugin.adaptive.metrics import draft_length_counts
from specdec_plugin.adaptive.policy import choose_draft_length, expected_tokens

K = 4
# A memory-bound target like the H100 7B: 6 ms up to 64 tokens, then compute grows.
GPU_LIKE = CostTable((1, 64, 256, 1024), (6.0e-3, 6.3e-3, 9.0e-3, 30.0e-3),
                     (0.4e-3, 0.45e-3, 0.8e-3, 2.5e-3), drafter_syncs_at_zero=True)
# n-gram: no device drafter.
NGRAM_LIKE = CostTable((1, 64, 256, 1024), (6.0e-3, 6.3e-3, 9.0e-3, 30.0e-3))


def rates(*per_position, n=1):
    return np.tile(np.array(per_position, dtype=float), (n, 1))


def test_expected_tokens_counts_the_chain_of_accepted_positions():
    r = rates(0.5, 0.5, 1.0, 0.0)
    assert expected_tokens(r, 0)[0] == 1.0
    assert expected_tokens(r, 1)[0] == pytest.approx(1.5)
    assert expected_tokens(r, 3)[0] == pytest.approx(1 + 0.5 + 0.25 + 0.25)
    assert expected_tokens(r, 4)[0] == pytest.approx(2.0)  # position 4 is never accepted


def test_drafts_that_never_land_give_a_plain_step():
    for cost in (GPU_LIKE, NGRAM_LIKE):
        for n in (1, 16, 64):
            assert choose_draft_length(rates(0, 0, 0, 0, n=n), cost, range(K + 1)).k == 0


def test_drafts_that_always_land_draft_all_k_when_verification_is_cheap():
    assert choose_draft_length(rates(1, 1, 1, 1), GPU_LIKE, range(K + 1)).k == K
    assert choose_draft_length(rates(1, 1, 1, 1, n=16), NGRAM_LIKE, range(K + 1)).k == K


def test_compute_bound_batches_draft_less():
    # The same acceptance: at batch 1 verification is free, at batch 256 every token costs.
    r = 0.6
    small = choose_draft_length(rates(r, r, r, r, n=1), GPU_LIKE, range(K + 1)).k
    large = choose_draft_length(rates(r, r, r, r, n=256), GPU_LIKE, range(K + 1)).k
    assert small >= K - 1
    assert large < small


def test_the_choice_maximises_tokens_per_second():
    r = rates(0.8, 0.5, 0.3, 0.1, n=8)
    decision = choose_draft_length(r, GPU_LIKE, range(K + 1), min_gain=0.0)
    expected = {k: expected_tokens(r, k).sum() / GPU_LIKE.step_time(8, k) for k in range(K + 1)}
    assert decision.k == max(expected, key=expected.get)
    assert decision.tokens_per_s == pytest.approx(expected)


def test_small_gains_go_to_the_shorter_draft():
    # Verification costs nothing extra, only the speculation overhead: drafting one token with
    # acceptance 0.07 gains 1.9% over a plain step, under min_gain, so no drafting.
    flat = CostTable((1, 1024), (1.0, 1.0))
    assert SPEC_STEP_OVERHEAD == 0.05
    decision = choose_draft_length(rates(0.07, 0, 0, 0), flat, range(K + 1), min_gain=0.03)
    assert decision.k == 0
    assert choose_draft_length(rates(0.07, 0, 0, 0), flat, range(K + 1), min_gain=0.0).k == 1


def test_a_marginal_gain_restarts_drafting_only_when_it_clears_the_resume_gain():
    # Flat table: a one-token draft costs the 5% overhead; acceptance a gains (1 + a) / 1.05.
    flat = CostTable((1, 1024), (1.0, 1.0))
    marginal = rates(0.12, 0, 0, 0, n=8)  # predicts +6.7%: inside the table's error
    clear = rates(0.30, 0, 0, 0, n=8)  # predicts +23.8%
    for r, gain in ((marginal, 0.067), (clear, 0.238)):
        scores = choose_draft_length(r, flat, range(K + 1)).tokens_per_s
        assert scores[1] / scores[0] - 1 == pytest.approx(gain, abs=1e-3)
    # On: keeps drafting while it gains min_gain. Off: starts only past resume_gain.
    assert choose_draft_length(marginal, flat, range(K + 1), drafting=True).k == 1
    assert choose_draft_length(marginal, flat, range(K + 1), drafting=False).k == 0
    assert choose_draft_length(marginal, flat, range(K + 1), drafting=False, resume_gain=0.0).k == 1
    assert choose_draft_length(clear, flat, range(K + 1), drafting=False).k == 1
    # Below min_gain nothing drafts, on or off.
    assert choose_draft_length(rates(0.07, 0, 0, 0), flat, range(K + 1), drafting=True).k == 0


def test_the_controller_once_off_resumes_only_for_a_clear_gain():
    flat = CostTable((1, 1024), (1.0, 1.0))
    ids = [f"r{i}" for i in range(25)]

    def controller(resume_gain, accepted_per_step):
        c = DraftLengthController(K, flat, learn_costs=False, resume_gain=resume_gain)
        for _ in range(40):  # K-token drafts; the same few requests accept the first each step
            for i, r in enumerate(ids):
                c.observe(r, K, 1 if i < accepted_per_step else 0)
            c.tracker.end_step()
        c.last_k = 0  # its last regime: plain steps
        return c

    marginal = controller(0.10, 3)  # 3 of 25 accept: position 1 at about 0.12
    gain = marginal.choose(ids)
    decision = choose_draft_length(marginal.tracker.batch_rates(ids), flat, range(K + 1))
    assert 0.03 < max(decision.tokens_per_s.values()) / decision.tokens_per_s[0] - 1 < 0.10
    assert gain == 0
    assert controller(0.0, 3).choose(ids) == 1  # the earlier rule: back on
    assert controller(0.10, 8).choose(ids) == 1  # 8 of 25: a clear gain
    on = controller(0.10, 3)
    on.last_k = 1
    assert on.choose(ids) == 1  # drafting already: the marginal gain keeps it on


def test_the_controller_logs_each_change_of_regime_once_at_info(caplog):
    """Issue 11: the chosen draft length shows at INFO when it changes regime (drafting on,
    drafting off), not at every step, and probes are no change of regime."""
    ids = [f"r{i}" for i in range(4)]
    c = DraftLengthController(K, GPU_LIKE, learn_costs=False)
    chosen = []
    with caplog.at_level("INFO", logger="specdec_plugin.adaptive.controller"):
        for step in range(80):
            k = c.choose(ids)
            chosen.append(k)
            for r in ids:  # every draft lands for 20 steps, then none does
                c.observe(r, k, k if step < 20 else 0)
            c.tracker.end_step()
    regimes = [r.getMessage().split(":")[1].strip() for r in caplog.records
               if r.levelname == "INFO" and "adaptive drafting" in r.getMessage()]
    assert [line.split()[2] for line in regimes] == ["on", "off"], (regimes, chosen)
    assert chosen[:20] == [K] * 20 and chosen[-1] == 0
    # Probes after the switch off (one-token drafts) did not log a regime of their own.
    assert any(0 < k < K for k in chosen[20:]), chosen


def test_protection_bars_lengths_that_slow_the_least_accepting_requests():
    # Half the batch accepts everything, half nothing: at batch 64 a 4-token verification is
    # 320 tokens and costs 1.5x a plain step (GPU_LIKE), which the batch's average pays for.
    n = 64
    mixed = np.vstack([rates(1, 1, 1, 1, n=n // 2), rates(0, 0, 0, 0, n=n // 2)])
    free = choose_draft_length(mixed, GPU_LIKE, range(K + 1))
    assert free.k > 0 and free.tokens_per_s[free.k] > 1.2 * free.tokens_per_s[0]
    # Protecting the lower quarter: its requests accept nothing, every length slows them.
    assert choose_draft_length(mixed, GPU_LIKE, range(K + 1), protect_quantile=0.25).k == 0
    # The 75th percentile is an accepting request: drafting slows none of the protected.
    assert choose_draft_length(mixed, GPU_LIKE, range(K + 1), protect_quantile=0.75).k == free.k
    # Where every request gains, protection changes nothing; at batch 1 neither does it.
    good = rates(0.8, 0.7, 0.6, 0.5, n=n)
    assert (choose_draft_length(good, GPU_LIKE, range(K + 1), protect_quantile=0.25).k
            == choose_draft_length(good, GPU_LIKE, range(K + 1)).k > 0)
    # Batch 1: the protected request is the batch, and a length that gains tokens per second
    # for the batch is one that does not slow it.
    rng = np.random.default_rng()
    for r in [rng.uniform(0, 1, size=(1, K)) for _ in range(50)]:
        assert (choose_draft_length(r, GPU_LIKE, range(K + 1), protect_quantile=0.25).k
                == choose_draft_length(r, GPU_LIKE, range(K + 1)).k), r


def test_protection_keeps_the_lengths_that_the_protected_request_can_afford():
    # A short draft is nearly free at batch 64 (128 tokens), a long one is not: requests that
    # accept half the first positions gain from k = 1 and lose at longer drafts.
    n = 64
    first_only = np.vstack([rates(1, 1, 1, 1, n=n // 2), rates(0.5, 0, 0, 0, n=n // 2)])
    free = choose_draft_length(first_only, GPU_LIKE, range(K + 1))
    protected = choose_draft_length(first_only, GPU_LIKE, range(K + 1), protect_quantile=0.25)
    assert free.k > protected.k > 0
    slow_side = rates(0.5, 0, 0, 0)[0]
    assert (expected_tokens(slow_side, protected.k)[0] / GPU_LIKE.step_time(n, protected.k)
            >= 1.0 / GPU_LIKE.step_time(n, 0))


def test_only_allowed_lengths_are_chosen():
    assert choose_draft_length(rates(1, 1, 1, 1), GPU_LIKE, (0, 2)).k == 2
    with pytest.raises(ValueError, match="outside"):
        choose_draft_length(rates(1, 1, 1, 1), GPU_LIKE, (0, K + 1))


def test_cost_table_interpolates_and_extrapolates():
    table = CostTable((1, 4, 16), (1.0, 2.0, 4.0), (0.5, 0.5, 1.0), drafter_syncs_at_zero=True)
    assert table.target(2) == pytest.approx(1 + 1 / 3)
    assert table.target(32) == pytest.approx(4.0 + 16 * (2.0 / 12))
    # k=0: target of n tokens plus the drafter's KV-sync pass; k=2: first pass over n*(1+k)
    # tokens and one more pass over n.
    assert table.step_time(4, 0) == pytest.approx(2.0 + 0.5)
    assert table.step_time(4, 2) == pytest.approx(table.target(12) + table.drafter(12) + table.drafter(4)
                                                  + SPEC_STEP_OVERHEAD * table.target(4))
    assert CostTable.from_json(table.to_json()) == table
    with pytest.raises(ValueError):
        CostTable((4, 1), (1.0, 2.0))
    assert fallback_table(True).source == "fallback"


def test_deferred_drafter_sync_charges_a_plain_step_a_share_of_one_longer_pass():
    # spec_decode/deferred_sync.py: one pass over 4 tokens per request every 4 plain steps.
    every_step = CostTable((1, 4, 16), (1.0, 2.0, 4.0), (0.5, 0.5, 1.0), drafter_syncs_at_zero=True)
    deferred = CostTable((1, 4, 16), (1.0, 2.0, 4.0), (0.5, 0.5, 1.0), drafter_syncs_at_zero=True,
                         drafter_sync_every=4)
    assert deferred.step_time(4, 0) == pytest.approx(2.0 + 1.0 / 4)
    assert deferred.step_time(4, 0) < every_step.step_time(4, 0)
    assert deferred.step_time(4, 2) == every_step.step_time(4, 2)  # drafting steps: unchanged
    assert CostTable.from_json(deferred.to_json()) == deferred
    # A table written without the field (an older engine's) still reads, as every step.
    raw = every_step.to_json().replace(', "drafter_sync_every": 1', "")
    assert "drafter_sync_every" not in raw and CostTable.from_json(raw) == every_step


def test_the_drafter_lm_head_is_charged_once_per_draft_token():
    # Issue 11 on the CPU, draft model at batch 1 (measured, ms): target 23.8 at 1 token and
    # 24.5 at 2 (LM head and argmax included), drafter pass 0.7, drafter LM head 0.63, its
    # k = 0 pass deferred over 8 steps. Without the drafter's head a first-position
    # acceptance of 0.15 looked worth drafting; with it, drafting pays from about 0.17.
    base = dict(token_counts=(1, 2, 4), target_s=(23.8e-3, 24.5e-3, 24.6e-3),
                drafter_s=(0.70e-3, 0.73e-3, 0.73e-3), drafter_syncs_at_zero=True,
                drafter_sync_every=8)
    without = CostTable(**base)
    table = CostTable(**base, drafter_sample_s=(0.63e-3, 0.65e-3, 0.78e-3))
    assert table.step_time(1, 0) == without.step_time(1, 0)  # k = 0 samples no draft
    assert table.step_time(1, 3) == pytest.approx(without.step_time(1, 3) + 3 * 0.63e-3)
    assert table.step_time(2, 1) == pytest.approx(without.step_time(2, 1) + 0.65e-3)
    assert CostTable.from_json(table.to_json()) == table
    with pytest.raises(ValueError):
        CostTable(**base, drafter_sample_s=(1.0,))
    rates = np.array([[0.15, 0.3, 0.3]])
    assert choose_draft_length(rates, without, range(4)).k > 0
    assert choose_draft_length(rates, table, range(4)).k == 0
    # Drafts that land still pay: code prompts accept about 0.75/0.62/0.53 (BENCHMARKS.md).
    assert choose_draft_length(np.array([[0.75, 0.62, 0.53]]), table, range(4)).k == 3


def test_acceptance_counts_only_tested_positions():
    tracker = AcceptanceTracker(AcceptanceSettings(max_k=4, prior_weight=1e-9, pool_weight=1e-9,
                                                   decay=1.0))
    tracker.observe("a", num_drafted=4, num_accepted=1)  # pos 1 accepted, pos 2 rejected
    tracker.observe("b", num_drafted=4, num_accepted=4)
    tracker.end_step()
    np.testing.assert_allclose(tracker.tested, [2, 2, 1, 1])
    np.testing.assert_allclose(tracker.accepted, [2, 1, 1, 1])
    np.testing.assert_allclose(tracker.engine_rates(), [1.0, 0.5, 1.0, 1.0], atol=1e-6)


def test_request_rates_are_shrunk_toward_the_engine():
    settings = AcceptanceSettings(max_k=2, prior_weight=1e-9, decay=1.0, request_prior_weight=1.0)
    tracker = AcceptanceTracker(settings)
    for _ in range(3):
        tracker.observe("good", 2, 2)
        tracker.end_step()
    tracker.observe("bad", 2, 0)
    tracker.end_step()
    batch = tracker.batch_rates(["good", "bad", "new"])
    engine = tracker.engine_rates()
    assert batch[0, 0] > engine[0] > batch[1, 0]
    np.testing.assert_allclose(batch[2], engine)  # unknown request: the engine's rates


def _run(controller, steps, accept):
    """Drive the controller: each step's drafts are accepted (True) or all rejected."""
    chosen = []
    for _ in range(steps):
        k = controller.choose(["r"])
        chosen.append(k)
        if k:
            controller.observe("r", k, k if accept else 0)
    return chosen


def test_controller_turns_off_when_drafts_miss_and_probes_with_backoff():
    from specdec_plugin.adaptive.controller import FIRST_PROBE_EVERY, MAX_PROBE_EVERY

    controller = DraftLengthController(K, GPU_LIKE)
    first = _run(controller, 30, accept=False)
    assert first[0] == K  # optimistic start
    # Off within a few steps of misses; from then on plain steps, but for a one-token probe.
    assert set(first[10:]) <= {0, 1} and first[10:].count(0) >= 18, first
    # Probes of one token come ever more rarely while drafts keep missing.
    later = _run(controller, 2000, accept=False)
    probe_steps = [i for i, k in enumerate(later) if k]
    assert all(later[i] == 1 for i in probe_steps)
    gaps = [b - a for a, b in zip(probe_steps, probe_steps[1:])]
    assert gaps and gaps == sorted(gaps) and gaps[-1] >= MAX_PROBE_EVERY
    assert len(probe_steps) <= 2000 // FIRST_PROBE_EVERY
    # Drafts start landing: the next probe sees it, and the controller drafts K again.
    again = _run(controller, MAX_PROBE_EVERY + 50, accept=True)
    assert again[-1] == K


def test_a_new_request_is_probed_soon_after_the_probes_backed_off():
    from specdec_plugin.adaptive.controller import FIRST_PROBE_EVERY, MAX_PROBE_EVERY

    controller = DraftLengthController(K, GPU_LIKE)
    _run(controller, 3000, accept=False)
    assert controller.probe_every == MAX_PROBE_EVERY
    # A request with no evidence of its own joins: a probe within FIRST_PROBE_EVERY steps.
    chosen = []
    for _ in range(FIRST_PROBE_EVERY + 1):
        k = controller.choose(["r", "new"])
        chosen.append(k)
        for req in ("r", "new") if k else ():
            controller.observe(req, k, 0)
    assert 1 in chosen, chosen
    # Seen once, it no longer shortens the interval: the probes back off again.
    gaps = _run_pair(controller, 600)
    assert gaps and min(gaps) > FIRST_PROBE_EVERY


def _run_pair(controller, steps):
    probe_steps = []
    for i in range(steps):
        k = controller.choose(["r", "new"])
        if k:
            probe_steps.append(i)
            for req in ("r", "new"):
                controller.observe(req, k, 0)
    return [b - a for a, b in zip(probe_steps, probe_steps[1:])]


def test_controller_keeps_drafting_when_drafts_land():
    controller = DraftLengthController(K, GPU_LIKE)
    assert set(_run(controller, 200, accept=True)) == {K}
    assert controller.probes == 0


def test_controller_forgets_finished_requests():
    controller = DraftLengthController(K, GPU_LIKE)
    controller.observe("r", 4, 4)
    controller.forget("r")
    np.testing.assert_allclose(controller.tracker.batch_rates(["r"])[0],
                               controller.tracker.engine_rates())


def test_draft_length_metric_counts():
    # 3 drafts: lengths 3, 3, 1; 10 tokens generated, 4 accepted -> 10 - 4 - 3 = 3 plain steps.
    counts = draft_length_counts([3, 2, 2], num_drafts=3, num_accepted=4, num_generation_tokens=10)
    assert counts == {3: 2, 1: 1, 0: 3}
    assert draft_length_counts([], 0, 0, 5) == {0: 5}


def test_the_resume_gain_switch(monkeypatch):
    from specdec_plugin import envs
    from specdec_plugin.adaptive.policy import RESUME_GAIN

    monkeypatch.delenv("SPECDEC_ADAPTIVE_RESUME_GAIN", raising=False)
    assert envs.adaptive_resume_gain() == RESUME_GAIN == 0.10
    monkeypatch.setenv("SPECDEC_ADAPTIVE_RESUME_GAIN", "0")
    assert envs.adaptive_resume_gain() == 0.0
    monkeypatch.setenv("SPECDEC_ADAPTIVE_RESUME_GAIN", " 0.25 ")
    assert envs.adaptive_resume_gain() == 0.25
    for bad in ("ten", "-0.1", "nan"):
        monkeypatch.setenv("SPECDEC_ADAPTIVE_RESUME_GAIN", bad)
        with pytest.raises(ValueError, match="SPECDEC_ADAPTIVE_RESUME_GAIN"):
            envs.adaptive_resume_gain()


def test_the_protect_switch(monkeypatch):
    from specdec_plugin import envs

    monkeypatch.delenv("SPECDEC_ADAPTIVE_PROTECT", raising=False)
    assert envs.adaptive_protect() is None  # opt-in
    monkeypatch.setenv("SPECDEC_ADAPTIVE_PROTECT", "0.25")
    assert envs.adaptive_protect() == 0.25
    for bad in ("quarter", "1.5", "-0.1"):
        monkeypatch.setenv("SPECDEC_ADAPTIVE_PROTECT", bad)
        with pytest.raises(ValueError, match="SPECDEC_ADAPTIVE_PROTECT"):
            envs.adaptive_protect()


def _engine_config(method: str = "ngram", schedule=None):
    """The parts of a VllmConfig that adaptive/config.py reads, for apply_adaptive."""
    from types import SimpleNamespace

    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K, method=method,
                                           num_speculative_tokens_per_batch_size=schedule,
                                           parallel_drafting=False),
        parallel_config=SimpleNamespace(data_parallel_size=1),
        scheduler_config=SimpleNamespace(scheduler_cls=None, async_scheduling=True))


def test_the_controller_says_at_info_why_it_is_off(monkeypatch, caplog):
    """Each way a user turns the controller off leaves vLLM's scheduler in place and says so,
    with the reason, at INFO where the config is built (README: "Adaptive drafting")."""
    from specdec_plugin.adaptive.config import apply_adaptive

    cases = [("1", [[1, 4, 2], [5, 64, 0]], "num_speculative_tokens_per_batch_size is set"),
             ("0", None, "SPECDEC_ADAPTIVE=0")]
    for switch, schedule, reason in cases:
        monkeypatch.setenv("SPECDEC_ADAPTIVE", switch)
        off = _engine_config("eagle3", schedule)
        caplog.clear()
        with caplog.at_level("INFO", logger="specdec_plugin.adaptive.config"):
            apply_adaptive(off)
        assert off.scheduler_config.scheduler_cls is None
        said = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
        assert f"specdec_plugin: adaptive drafting off ({reason})" in said, said
    # And on, for contrast: no such line.
    monkeypatch.setenv("SPECDEC_ADAPTIVE", "1")
    on = _engine_config("eagle3")
    caplog.clear()
    with caplog.at_level("INFO", logger="specdec_plugin.adaptive.config"):
        apply_adaptive(on)
    assert on.scheduler_config.scheduler_cls.endswith("AdaptiveAsyncScheduler")
    assert not [r for r in caplog.records if "adaptive drafting off" in r.getMessage()]


def test_a_bad_controller_setting_fails_where_the_config_is_built(monkeypatch):
    from specdec_plugin.adaptive.config import apply_adaptive

    monkeypatch.delenv("SPECDEC_ADAPTIVE", raising=False)
    good = _engine_config()
    apply_adaptive(good)
    assert good.scheduler_config.scheduler_cls.endswith("AdaptiveAsyncScheduler")
    # "often" is no number, and no method name for the two per-method switches.
    for name in ("SPECDEC_ADAPTIVE_RESUME_GAIN", "SPECDEC_ADAPTIVE_PROTECT",
                 "SPECDEC_ADAPTIVE_PROBE_BUDGET", "SPECDEC_ADAPTIVE_SWITCH_GAIN",
                 "SPECDEC_ADAPTIVE_OBSERVED_COST", "SPECDEC_ADAPTIVE_TABLE_LENGTHS",
                 "SPECDEC_ADAPTIVE_LENGTH_GAIN", "SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST",
                 "SPECDEC_ADAPTIVE_PROBE_COST"):
        monkeypatch.setenv(name, "often")
        bad = _engine_config()
        with pytest.raises(ValueError, match=name):
            apply_adaptive(bad)
        assert bad.scheduler_config.scheduler_cls is None
        monkeypatch.delenv(name)
