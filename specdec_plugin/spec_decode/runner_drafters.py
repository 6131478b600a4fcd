"""Our drafters in the V1 runner, chosen after the runner built vLLM's (the runner's seam).

``GPUModelRunner.__init__`` builds its drafter from vLLM's classes; a subclass may replace
``self.drafter`` once ``super().__init__()`` returns, and the runner's later type checks
(``isinstance(self.drafter, EagleProposer)``) accept our subclasses. vLLM's instance is dropped:
for these two classes its constructor only allocates buffers.

The n-gram and suffix proposers have no such seam (patch P7 says why) and stay rebound by name.
"""
from __future__ import annotations

from vllm.v1.spec_decode.draft_model import DraftModelProposer
from vllm.v1.spec_decode.eagle import EagleProposer

from specdec_plugin.spec_decode.graphed_proposers import (
    SpecDecDraftModelProposer,
    SpecDecEagleProposer,
)

# vLLM's class (exact type, so its own subclasses such as Gemma4Proposer stay) -> ours.
DRAFTERS: dict[type, type] = {
    EagleProposer: SpecDecEagleProposer,  # EAGLE, EAGLE-3, MTP
    DraftModelProposer: SpecDecDraftModelProposer,
}


def install_drafter(runner) -> None:
    """Replace ``runner.drafter`` by our subclass where we have one (same constructor)."""
    ours = DRAFTERS.get(type(getattr(runner, "drafter", None)))
    if ours is not None:
        runner.drafter = ours(vllm_config=runner.vllm_config, device=runner.device,
                              runner=runner)
