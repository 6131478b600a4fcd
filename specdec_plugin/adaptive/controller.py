"""The controller: acceptance state + cost table + policy, called once per engine step.

Lives in the engine-core process, inside the scheduler (``scheduler.py``): the scheduler knows
the batch, sees every verification result, and its choice reaches the proposer with the step
(``SchedulerOutput.num_spec_tokens_to_schedule``).

Probes: while the policy says 0, no drafts are verified, so no evidence arrives that drafts
would land again. Every ``probe_every`` plain steps the controller drafts one token per
request anyway; each probe after which the policy still says 0 doubles the interval (up to
``max_probe_every``), so that a workload where drafting never pays spends at most a probe's
cost every few hundred steps; drafting again resets it, and so does a request the controller
has no evidence of (a new one): its drafts may land where the others' missed, and with the
interval backed off to hundreds of steps it would otherwise wait that long for its first
draft. In the replay of issue 11's workloads (benchmarks/replay_controller.py), an engine that
had served prose never drafted for the code-editing requests that came after it.

The first interval is at least ``FIRST_PROBE_EVERY`` steps, and longer where a probe costs
more than ``probe_budget`` of the plain steps it follows (``first_probe_every``): a probe's
verification step costs little at batch 1 but, at batch 64 on an H200 (random 7B, every draft
rejected, session 32's step logs), 1.9 ms over a 5.1 ms plain step, so probing every 16 steps
cost about 2% of a run whose new requests kept the interval at its first value.
The budget is for probing requests whose own drafts were seen to miss: the share of a
probe spent on requests with no evidence yet (new ones) is not charged to it. A new request
that is the whole batch is probed within ``FIRST_PROBE_EVERY`` steps of the last probe, but
not before ``ARRIVAL_GRACE`` steps after it arrives, so that a batch whose prefill spans two
steps is probed once, whole (session 44 traced three probes per run where one was meant);
one new request among 64
waits about as long as the budget says. Such a probe counts as the budgeted first one: the
next comes after twice the budgeted interval (not twice ``FIRST_PROBE_EVERY``), so a batch of
new requests whose drafts keep missing is probed as often as before, only sooner (at batch 64
with every draft rejected and fresh requests every 128 steps, once per run either way). Why:
on a CPU the draft model's probe at batch 1 costs ~38% over a plain step (issue 11, session
36), so the budget made the first interval 76 steps, longer than the benchmark's 64-token
requests: requests that arrived while drafting was off were served without a single probe,
on the evidence of an earlier request.

With ``measure_probes`` (``SPECDEC_ADAPTIVE_PROBE_COST=observed``, the CUDA default) the
budget prices a probe by what the probes at this batch size were seen to cost, their drafting
step and the drained step after them included (``probe_cost.py``), instead of by the cost
table's verifying step (until one has been measured there, and with ``table``).

Costs: the start-up cost table, corrected by the step times the scheduler observes
(``observe_step_time``, ``observed_cost.py``) where ``learn_costs`` is on
(``SPECDEC_ADAPTIVE_OBSERVED_COST``: by default on CUDA GPUs for suffix and EAGLE-3, on CPUs
for n-gram and EAGLE-3;
envs.py).
A probe's verifying step is an observation of its length, so probes also tell what drafting
costs while the controller is off.

Regimes: once off, drafting must promise ``resume_gain`` over plain steps to start again
(``policy.py``, hysteresis; ``SPECDEC_ADAPTIVE_RESUME_GAIN``); a new engine starts on. With
``switch_gain`` (``SPECDEC_ADAPTIVE_SWITCH_GAIN``, opt-in) a drafting length is kept until
another promises that much more; with ``length_gain`` (``SPECDEC_ADAPTIVE_LENGTH_GAIN``,
opt-in) a longer drafting length needs that margin over a shorter one instead of ``min_gain``.
With
``protect_quantile`` (``SPECDEC_ADAPTIVE_PROTECT``, opt-in) no length is chosen that is expected
to slow down the request at that quantile of acceptance.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

from specdec_plugin.adaptive.acceptance import AcceptanceSettings, AcceptanceTracker
from specdec_plugin.adaptive.cost_model import CostTable
from specdec_plugin.adaptive.observed_cost import ObservedCost, ObservedCostSettings
from specdec_plugin.adaptive.policy import RESUME_GAIN, batch_tokens, choose_draft_length, decide
from specdec_plugin.adaptive.probe_cost import ProbeCost
from specdec_plugin.log import init_logger

logger = init_logger(__name__)

FIRST_PROBE_EVERY = 16
MAX_PROBE_EVERY = 512
PROBE_LENGTH = 1
# Steps that new requests wait for the rest of their wave before a probe brought forward for
# them: the benchmark's 64 requests reach their first decode over two steps (43, then 21;
# session 44), and a probe at the first of them left the others for a second probe.
ARRIVAL_GRACE = 2
# The share of the plain steps' time that the first probe interval may spend on probing
# (SPECDEC_ADAPTIVE_PROBE_BUDGET; 0: every first interval is FIRST_PROBE_EVERY steps).
PROBE_BUDGET = 0.005


def first_probe_every(probe_seconds: float, plain_seconds: float, budget: float,
                      known_share: float = 1.0) -> int:
    """The first probe interval: long enough that one probe step's extra time over a plain
    step, times ``known_share`` (the share of the batch's requests that have evidence of their
    own), is at most ``budget`` of the plain steps' time between probes, and never under
    ``FIRST_PROBE_EVERY`` (nor over ``MAX_PROBE_EVERY``)."""
    if budget <= 0 or plain_seconds <= 0:
        return FIRST_PROBE_EVERY
    extra = max(probe_seconds / plain_seconds - 1.0, 0.0) * min(max(known_share, 0.0), 1.0)
    # (less a hair, so that 0.37 / 0.005 = 74.00000000000001 asks for 74 steps)
    return int(min(max(FIRST_PROBE_EVERY, math.ceil(extra / budget - 1e-9)), MAX_PROBE_EVERY))


class DraftLengthController:
    def __init__(self, max_k: int, cost: CostTable, allowed: Sequence[int] | None = None,
                 settings: AcceptanceSettings | None = None, learn_costs: bool = True,
                 resume_gain: float = RESUME_GAIN, protect_quantile: float | None = None,
                 cost_estimator: str = "median", probe_budget: float = PROBE_BUDGET,
                 switch_gain: float | None = None, length_gain: float | None = None,
                 measure_probes: bool = False, untested_decay: float | None = None):
        self.max_k = max_k
        self.length_gain = length_gain  # None: min_gain between drafting lengths too (policy.py)
        self.probe_budget = probe_budget
        self.switch_gain = switch_gain  # None: no hold between drafting lengths (policy.py)
        self.resume_gain = resume_gain
        self.protect_quantile = protect_quantile
        self.table = cost
        self.observed_cost = (ObservedCost(cost, ObservedCostSettings(estimator=cost_estimator))
                              if learn_costs else None)
        # What the policy reads: the table, corrected where steps were observed.
        self.cost = self.observed_cost if self.observed_cost is not None else cost
        self.allowed = tuple(sorted(set(allowed))) if allowed is not None else tuple(range(max_k + 1))
        self.tracker = AcceptanceTracker(
            settings or AcceptanceSettings(max_k=max_k, untested_decay=untested_decay))
        self.last_k: int | None = None
        drafting = [k for k in self.allowed if k > 0]
        self.probe_length = min(drafting, key=lambda k: abs(k - PROBE_LENGTH)) if drafting else 0
        self.probe_every = FIRST_PROBE_EVERY
        # What probes were seen to cost (None: the cost table prices them).
        self.probe_cost = ProbeCost() if measure_probes else None
        # The plain-step count by which requests with no evidence are to be probed (None: no
        # such request waits), and the (batch size, new requests) it last answered.
        self._probe_due: int | None = None
        self._unseen_batch = None
        self._plain_steps = 0
        # How many steps chose each length: read by tests and the benchmark.
        self.choices: Counter[int] = Counter()
        self.probes = 0
        # The last policy decision and what it was computed from (choose()).
        self._decision_key: tuple | None = None
        self._decision = None
        # The batch's expected tokens per length and what they were computed from.
        self._tokens_key: tuple | None = None
        self._tokens = None

    def observe(self, req_id: str, num_drafted: int, num_accepted: int) -> None:
        self.tracker.observe(req_id, num_drafted, num_accepted)

    def forget(self, req_id: str) -> None:
        self.tracker.forget(req_id)

    def observe_step_time(self, num_reqs: int, k: int, seconds: float) -> None:
        """A pure decode step of ``num_reqs`` requests that verified ``k`` drafts took
        ``seconds`` (``step_timing.py``)."""
        if self.observed_cost is None:
            return
        self.observed_cost.observe(num_reqs, k, seconds)
        # Once per significant move, not every step.
        for length, before, now in self.observed_cost.changes(self.allowed):
            logger.info(
                "specdec_plugin: adaptive drafting: steps verifying %d draft tokens take %.2fx "
                "the start-up cost table's time (was %.2fx; %d such steps seen, the last at "
                "batch %d in %.2f ms); draft lengths are chosen with this correction",
                length, now, before, self.observed_cost.observations[length], num_reqs,
                seconds * 1e3)

    def observe_interval(self, num_reqs: int, seconds: float, steady: bool, plain: bool,
                         probe: bool) -> None:
        """Any step's result interval, in schedule order (``probe_cost.py``): ``plain`` it
        neither verified nor drafted, ``probe`` its drafts were a probe of ``choose``."""
        if self.probe_cost is not None:
            self.probe_cost.step(num_reqs, seconds, steady, plain, probe)

    def _first_probe_every(self, num_reqs: int, unseen: int = 0) -> int:
        if self.probe_length == 0 or num_reqs == 0:
            return FIRST_PROBE_EVERY
        plain = self.cost.step_time(num_reqs, 0)
        probe = self.cost.step_time(num_reqs, self.probe_length)
        seen = self.probe_cost.extra_steps(num_reqs) if self.probe_cost is not None else None
        if seen is not None:
            probe = plain * (1.0 + seen)
        return first_probe_every(probe, plain, self.probe_budget,
                                 known_share=1.0 - unseen / num_reqs)

    def choose(self, req_ids: Sequence[str]) -> int:
        self.tracker.end_step()
        # While off, requests with no evidence of their own bring the next probe forward. The
        # interval depends only on the batch size and how many are new, so it is worked out
        # again only when those change (not every plain step while a request waits).
        unseen = 0
        if self.last_k == 0 and self.probe_every > FIRST_PROBE_EVERY:
            unseen = self.tracker.count_unseen(req_ids)
        batch = (len(req_ids), unseen) if unseen else None
        if batch is None:
            self._probe_due = None
        elif batch != self._unseen_batch:
            # Due the first interval after the last probe, but not before ARRIVAL_GRACE more
            # steps: a batch whose prefill spans two steps is then probed once, whole. The
            # step after a probe still sees its requests as new (async scheduling verifies the
            # probe after scheduling that step); their results clear what that step set due.
            due = max(self._first_probe_every(len(req_ids), unseen),
                      self._plain_steps + ARRIVAL_GRACE)
            self._probe_due = due if self._probe_due is None else min(self._probe_due, due)
        self._unseen_batch = batch  # forgotten on any step that does not ask
        drafting = self.last_k is None or self.last_k > 0
        # While nothing is drafted, nothing the policy reads changes from step to step: no
        # results arrive (the tracker's version stays), the batch is the same requests, and a
        # start-up cost table never changes. The policy then gives the same decision, so it is
        # kept rather than recomputed (the rates of every request and every length's expected
        # tokens/s, ~0.15-0.3 ms per step at batch 1-64 on a 2-core AMD EPYC, on the host every
        # step: bench_host_step_cpu.py). Observed step costs (learn_costs) change with every
        # step's time, so with them the decision is made again every step, but from the
        # batch's expected tokens per length kept while the rates and the batch stay the same
        # (policy.batch_tokens): reading every request's rates was most of the policy's time,
        # 59 against 5 us a step at batch 64 on this project's 2-core EPYC (session 41).
        # (A tracker without a version, as the reference one of tests/test_adaptive_equivalence.py,
        # is read every step.)
        key, version = None, getattr(self.tracker, "version", None)
        if self.observed_cost is None and version is not None:
            key = (version, tuple(req_ids), self.last_k)  # last_k also decides `drafting`
        if key is not None and key == self._decision_key:
            decision = self._decision
        elif version is None:
            decision = choose_draft_length(self.tracker.batch_rates(req_ids), self.cost,
                                           self.allowed, drafting=drafting,
                                           resume_gain=self.resume_gain,
                                           protect_quantile=self.protect_quantile,
                                           current=self.last_k, switch_gain=self.switch_gain,
                                           length_gain=self.length_gain)
        else:
            tokens_key = (version, tuple(req_ids))
            if tokens_key != self._tokens_key:
                self._tokens_key = tokens_key
                self._tokens = batch_tokens(self.tracker.batch_rates(req_ids), self.allowed,
                                            self.protect_quantile)
            decision = decide(self._tokens, self.cost, drafting=drafting,
                              resume_gain=self.resume_gain, current=self.last_k,
                              switch_gain=self.switch_gain, length_gain=self.length_gain)
            self._decision_key, self._decision = key, decision
        k = decision.k
        if k == 0:
            if self.last_k != 0 and self._plain_steps == 0:  # the first plain step of a run
                self.probe_every = self._first_probe_every(len(req_ids))
            self._plain_steps += 1
            due = self.probe_every if self._probe_due is None else min(self.probe_every,
                                                                      self._probe_due)
            if self._plain_steps >= due:
                # Backed off from at least the budgeted interval: a probe brought forward for
                # new requests counts as the budgeted first probe, so a batch of new requests
                # whose drafts keep missing is probed no more often than before, only sooner.
                done = due if due == self.probe_every else 0
                self.probe_every = min(2 * max(done, self._first_probe_every(len(req_ids))),
                                       MAX_PROBE_EVERY)
                self._plain_steps = 0
                self._probe_due = self._unseen_batch = None
                self.probes += 1
                self.choices[self.probe_length] += 1
                return self.probe_length  # a probe is not a change of regime
        else:
            self._plain_steps = 0
            self._probe_due = None
        self.choices[k] += 1
        if self.last_k is None or (k == 0) != (self.last_k == 0):
            rates = self.tracker.engine_rates()
            logger.info(
                "specdec_plugin: adaptive drafting %s: %d draft tokens per step at batch %d "
                "(acceptance per position %s; expected tokens/s by length %s)",
                "off" if k == 0 else "on", k, len(req_ids),
                "/".join(f"{r:.2f}" for r in rates),
                ", ".join(f"{kk}: {v:.3g}" for kk, v in decision.tokens_per_s.items()),
            )
        elif k != self.last_k:
            logger.debug("specdec_plugin: adaptive drafting %d -> %d tokens", self.last_k, k)
        self.last_k = k
        return k
