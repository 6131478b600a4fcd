"""Step times from the engine's schedule/result times (specdec_plugin/adaptive/step_timing.py):
which step an interval belongs to, synchronous and with async scheduling, and which intervals
are not a step's cost. Scheduler outputs are stand-ins with the fields the timer reads."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from specdec_plugin.adaptive.step_timing import StepTime, StepTimer, pure_decode

N = 4


def step(verify: int, choose: int, new: bool = False, n: int = N, prefill_tokens: int = 0):
    """A new scheduler output (the timer knows outputs by identity, as vLLM makes one per step): ``n`` requests verifying ``verify`` drafts each (or, with ``new``,
    prefilling ``prefill_tokens``), the controller having chosen ``choose`` for the next."""
    tokens = {f"r{i}": (prefill_tokens if new else 1 + verify) for i in range(n)}
    spec = {} if new or not verify else {f"r{i}": [-1] * verify for i in range(n)}
    return SimpleNamespace(
        scheduled_new_reqs=[object()] if new else [],
        scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set()),
        num_scheduled_tokens=tokens, scheduled_spec_decode_tokens=spec,
        total_num_scheduled_tokens=sum(tokens.values()), num_spec_tokens_to_schedule=choose)


def empty():
    return SimpleNamespace(scheduled_new_reqs=[], num_scheduled_tokens={},
                           scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set()),
                           scheduled_spec_decode_tokens={}, total_num_scheduled_tokens=0,
                           num_spec_tokens_to_schedule=3)


def predict(n, k):
    return 0.010  # 10 ms whatever the step: the scale of an idle gap


UPDATE = 0.001  # host time of update_from_output
GAP = 0.0001  # host time between handling a result and scheduling the next step


def run_sync(steps, durations, waits=None):
    """EngineCore.step: schedule, run, handle the result, one step at a time. ``waits[i]``:
    time the engine waited before scheduling step i (idle)."""
    timer, t, seen = StepTimer(predict), 0.0, []
    for i, (out, seconds) in enumerate(zip(steps, durations)):
        t += (waits or {}).get(i, 0.0)
        timer.scheduled(out, t)
        t += seconds
        seen.append(timer.output(out, t))
        t += UPDATE
        timer.output_done(t)
        t += GAP
    return seen


def run_async(steps, durations, host=0.002):
    """EngineCore.step_with_batch_queue with a queue of 2: step i+1 is scheduled (``host``
    seconds of host work) and handed to the device before the engine waits for step i."""
    timer, t, seen = StepTimer(predict), 0.0, []
    device_free, queue = 0.0, []
    for out, seconds in zip(steps, durations):
        timer.scheduled(out, t)
        t += host
        start = max(device_free, t)
        device_free = start + seconds
        queue.insert(0, (out, device_free))
        if len(queue) < 2:
            continue
        done_out, done_at = queue.pop()
        t = max(t, done_at)
        seen.append(timer.output(done_out, t))
        t += UPDATE
        timer.output_done(t)
    return seen


def test_sync_steps_are_timed_result_to_result_and_charged_to_the_verified_length():
    steps = [step(0, 2, new=True, prefill_tokens=20),  # prefill: no draft length's cost
             step(2, 2), step(2, 0),  # drafting; then the controller turns it off
             step(0, 0),
             step(0, 1),  # a probe's first step: prepares a draft it does not verify
             step(1, 0)]  # the probe's draft verified
    durations = [0.050, 0.010, 0.011, 0.005, 0.006, 0.009]
    seen = run_sync(steps, durations)
    assert seen[0] is None  # a prefill, and no earlier result
    loop = UPDATE + GAP  # the previous result's handling is part of a synchronous step
    assert seen[1:] == [
        StepTime(N, 2, pytest.approx(0.010 + loop)),
        StepTime(N, 2, pytest.approx(0.011 + loop)),  # verified 2, whatever it chose next
        StepTime(N, 0, pytest.approx(0.005 + loop)),
        None,
        StepTime(N, 1, pytest.approx(0.009 + loop)),  # the probe: an observation of k = 1
    ]


def test_async_intervals_belong_to_the_step_whose_result_closes_them():
    # The device is the slower side: each interval between results is that step's device time.
    steps = [step(0, 3, new=True, prefill_tokens=20)] + [step(3, 3) for _ in range(3)] + [step(3, 0)] \
        + [step(0, 0) for _ in range(3)] + [step(0, 0, new=True, prefill_tokens=20)]
    durations = [0.040, 0.012, 0.013, 0.014, 0.015, 0.006, 0.007, 0.008, 0.040]
    seen = run_async(steps, durations)
    # The last step is scheduled but its result never handled (the queue is not drained).
    assert len(seen) == len(steps) - 1
    assert seen[0] is None
    assert [(s.k, round(s.seconds, 6)) for s in seen[1:]] == [
        (3, 0.012), (3, 0.013), (3, 0.014), (3, 0.015), (0, 0.006), (0, 0.007), (0, 0.008)]


def test_async_host_bound_steps_measure_the_host_loop():
    # The host is the slower side (4 ms of scheduling per step, device 1 ms): the pipeline's
    # time per step is the host's, and that is what each step is charged.
    steps = [step(2, 2) for _ in range(6)]
    seen = run_async(steps, [0.001] * 6, host=0.004)
    assert all(s.seconds == pytest.approx(0.004 + UPDATE) for s in seen[1:]), seen


def test_a_step_after_an_idle_wait_is_not_timed():
    steps = [step(2, 2) for _ in range(4)]
    seen = run_sync(steps, [0.010] * 4, waits={2: 1.0})
    assert seen[1] is not None and seen[2] is None and seen[3] is not None
    # A wait shorter than half a predicted step is host work, and counts.
    seen = run_sync(steps, [0.010] * 4, waits={2: 0.004})
    assert seen[2].seconds == pytest.approx(0.010 + UPDATE + GAP + 0.004)


def test_an_empty_step_breaks_the_chain():
    steps = [step(2, 2), step(2, 2), empty(), step(2, 2), step(2, 2)]
    seen = run_sync(steps, [0.010, 0.010, 0.0, 0.010, 0.010])
    assert seen[1] is not None and seen[2] is None and seen[3] is None
    assert seen[4] == StepTime(N, 2, pytest.approx(0.010 + UPDATE + GAP))


def test_only_pure_decode_steps_count():
    assert pure_decode(step(2, 2), 2)
    assert pure_decode(step(0, 2), 2)
    assert not pure_decode(step(3, 3), 2)  # more drafts than the length charged
    assert not pure_decode(step(0, 0, new=True, prefill_tokens=1), 0)  # a new request
    chunk = step(2, 2)
    chunk.num_scheduled_tokens["r0"] = 64  # a prefill chunk among decodes
    assert not pure_decode(chunk, 2)
    resumed = step(2, 2)
    resumed.scheduled_cached_reqs.resumed_req_ids = {"r1"}
    assert not pure_decode(resumed, 2)
    # n-gram drafting: some requests draft fewer or none, still a decode step of length 2.
    ragged = step(2, 2)
    ragged.scheduled_spec_decode_tokens = {"r0": [5, 6], "r1": [7]}
    ragged.num_scheduled_tokens = {"r0": 3, "r1": 2, "r2": 1, "r3": 1}
    assert pure_decode(ragged, 2)
