"""What each engine step really took, from the times its scheduler output and its result were
handled: the observations that correct the cost table (``observed_cost.py``).

The scheduler calls ``scheduled`` when it starts building a step and ``output`` / ``output_done``
around ``update_from_output`` of that step; the clock is the caller's (``time.perf_counter``).

Which interval belongs to which step. vLLM hands results to ``update_from_output`` in the order
the steps were scheduled, with or without async scheduling, so a step's time is measured from
the previous step's result to its own:

- Synchronous (``EngineCore.step``): schedule, execute, update, one step at a time. Between two
  results lies all of one step: its scheduling, forward pass, sampling and drafting, and the
  previous result's bookkeeping.
- Async scheduling (``EngineCore.step_with_batch_queue``, a queue of 2): step i+1 is scheduled
  and handed to the device before the engine waits for step i's result, so the device starts
  step i+1 as soon as step i ends, and the interval between results i and i+1 is how long the
  pipeline spent on step i+1, its own forward pass or, where the host is the slower side, the
  host's work per step. It is attributed to step i+1, whose result closes it.

Which draft length. The step's cost is mostly verifying the drafts it carries: the length that
the controller chose when the previous step was scheduled (``num_spec_tokens_to_schedule`` of the
previous non-empty step, which is the one that drafted them, in both modes). That choice, not
the number of drafts that arrived, is what is charged: with n-gram or suffix drafting some
requests draft fewer or none, and the policy needs the cost of choosing k, whatever the proposer
made of it. Steps that also prepare a longer draft than they verify (drafting turns on, a
probe's first step) are left out: they pay the drafter's catch-up after plain steps, a cost of
changing regime that the table leaves out on purpose (``cost_model.py``).

Which steps count. Only pure decode steps: no new request, and every request schedules its one
token plus its drafts, since a prefill's tokens are no draft length's cost. And only steps that
followed the previous one back to back: a step scheduled more than ``idle_fraction`` of its
predicted time after the previous result was handled waited for something else (the engine was
idle, with nothing in flight), and the interval is not its cost. Under async scheduling the next
step is scheduled before the previous result comes back, so this never discards a pipelined
step. An empty step (nothing scheduled) is no step's cost and breaks the chain: the engine was
waiting on something, so the interval up to the next result is not a step's cost either.

Every timed interval, whatever its step verified or drafted, is also kept as ``last_interval``,
with whether it was a steady one (pure decode, back to back): ``probe_cost.py`` prices the
controller's probes from the steps around them, which include a drafting step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# Scheduler outputs whose result has not come back yet: at most the batch queue's (2), more
# only if a step failed; bounded so that a failure does not grow the dict.
_MAX_IN_FLIGHT = 16


@dataclass(frozen=True)
class StepTime:
    num_reqs: int
    k: int
    seconds: float


@dataclass(frozen=True)
class Interval:
    """Every timed step's interval, whatever it verified or drafted (``probe_cost.py`` reads
    them): ``verified`` the length chosen for it by the step before, ``chose`` its own choice,
    ``steady`` whether it was a pure decode step scheduled back to back."""
    num_reqs: int
    seconds: float
    verified: int
    chose: int
    steady: bool


def pure_decode(scheduler_output, k: int) -> bool:
    """Every request decodes one token plus at most ``k`` drafts, and none is new or resumed."""
    if scheduler_output.scheduled_new_reqs:
        return False
    if getattr(scheduler_output.scheduled_cached_reqs, "resumed_req_ids", None):
        return False
    spec = scheduler_output.scheduled_spec_decode_tokens
    for req_id, tokens in scheduler_output.num_scheduled_tokens.items():
        drafts = len(spec.get(req_id, ()))
        if drafts > k or tokens != 1 + drafts:
            return False
    return True


class StepTimer:
    def __init__(self, predict: Callable[[int, int], float], idle_fraction: float = 0.5):
        """``predict(n, k)``: the step's expected seconds (the cost table), the scale of an
        idle gap."""
        self.predict = predict
        self.idle_fraction = idle_fraction
        self._scheduled_at: dict[int, float] = {}
        self._last_result: float | None = None
        self._last_done: float | None = None
        self._last_choice: int | None = None
        # The interval of the last step given to ``output`` (None: it had none to time).
        self.last_interval: Interval | None = None

    def scheduled(self, scheduler_output, now: float) -> None:
        """The scheduler started building ``scheduler_output`` at ``now``."""
        # By id: the output object is alive until its result is handled, and vLLM's
        # SchedulerOutput travels to the workers, so it carries nothing of ours.
        self._scheduled_at[id(scheduler_output)] = now
        while len(self._scheduled_at) > _MAX_IN_FLIGHT:
            self._scheduled_at.pop(next(iter(self._scheduled_at)))

    def output(self, scheduler_output, now: float) -> StepTime | None:
        """The result of ``scheduler_output`` arrived at ``now``: its step's time, or None when
        the interval is not a pure decode step's cost."""
        scheduled_at = self._scheduled_at.pop(id(scheduler_output), None)
        if scheduler_output.total_num_scheduled_tokens <= 0:
            # Nothing was schedulable: the engine is waiting on something, and the next
            # interval would include that wait.
            self._last_result = None
            self.last_interval = None
            return None
        previous, previous_done, k = self._last_result, self._last_done, self._last_choice
        self._last_result = now
        self._last_done = None
        chose = scheduler_output.num_spec_tokens_to_schedule
        self._last_choice = chose
        self.last_interval = None
        if previous is None or previous_done is None or scheduled_at is None or k is None:
            return None
        n = len(scheduler_output.num_scheduled_tokens)
        decode = pure_decode(scheduler_output, k)
        back_to_back = scheduled_at - previous_done <= self.idle_fraction * self.predict(n, k)
        self.last_interval = Interval(n, now - previous, k, chose, decode and back_to_back)
        if chose > k or not decode or not back_to_back:
            return None
        return StepTime(n, k, now - previous)

    def output_done(self, now: float) -> None:
        """The result last given to ``output`` has been handled."""
        self._last_done = now
