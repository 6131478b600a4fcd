"""A vLLM scheduler whose draft lengths follow a fixed pattern, step by step (tests only).

Given to an engine as ``scheduler_cls="tests.forced_draft_lengths.ForcedDraftLengthScheduler"``:
it sits where the adaptive controller sits (vLLM's ``dynamic_sd_lookup``, see
specdec_plugin/adaptive/scheduler.py), so the k of each step reaches the proposer exactly as
the controller's does, without the controller's timing-dependent choices. Same inputs, same
pattern: the same k at every step in two engines.
"""
from __future__ import annotations

import json
import os

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from specdec_plugin.adaptive.uniform_drafts import FILLER_SLOTS, UniformDraftsMixin

# Runs of k = 0 shorter and longer than the deferral depth (8), each ended by a drafting step.
PATTERN = (3, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 3, 3, 0, 0, 0, 0, 0, 0)


class _Pattern:
    def __init__(self):
        self.step = 0

    def __getitem__(self, num_reqs: int) -> int:
        k = PATTERN[self.step % len(PATTERN)]
        self.step += 1
        return k


class ForcedDraftLengthScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dynamic_sd_lookup = _Pattern()


class ForcedUniformDraftScheduler(UniformDraftsMixin, ForcedDraftLengthScheduler):
    """The forced pattern with draft padding (specdec_plugin/adaptive/uniform_drafts.py, on
    when SPECDEC_UNIFORM_DRAFTS=1 in the engine's environment). Each step's scheduled drafts
    (real tokens, filler slots, per request) are appended as JSON lines to the file named by
    SPECDEC_TEST_SCHEDULE_LOG: the engine core may run in another process than the test."""

    def schedule(self, *args, **kwargs):
        out = super().schedule(*args, **kwargs)
        path = os.environ.get("SPECDEC_TEST_SCHEDULE_LOG")
        if path and out.scheduled_spec_decode_tokens:
            filler = getattr(out, FILLER_SLOTS, {})
            with open(path, "a") as log:
                log.write(json.dumps({
                    "asked": out.num_spec_tokens_to_schedule,
                    "spec_lens": {r: len(s) for r, s in out.scheduled_spec_decode_tokens.items()},
                    "filler": filler,
                    "tokens": dict(out.num_scheduled_tokens),
                }) + "\n")
        return out
class ForcedDraftLengthAsyncScheduler(AsyncScheduler):
    """The same pattern under async scheduling (tests/test_suffix_async_engine.py)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dynamic_sd_lookup = _Pattern()
