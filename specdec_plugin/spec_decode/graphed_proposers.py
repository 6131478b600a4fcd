"""vLLM's V1 drafters that replay their steps from our graphs (see drafter_graphs.py), and
take a plain decode step's next tokens without vLLM's per-request loop
(plain_step_next_tokens.py).

The runner installs these after its constructor (spec_decode/runner_drafters.py). On a device without graphs they behave exactly as
vLLM's classes.
"""
from __future__ import annotations

from vllm.v1.spec_decode.draft_model import DraftModelProposer
from vllm.v1.spec_decode.eagle import EagleProposer

from specdec_plugin.spec_decode.drafter_graphs import DrafterGraphs
from specdec_plugin.spec_decode.plain_step_next_tokens import PlainStepNextTokens


class SpecDecEagleProposer(PlainStepNextTokens, DrafterGraphs, EagleProposer):
    """EAGLE, EAGLE-3 and MTP drafting (vLLM's ``EagleProposer``)."""


class SpecDecDraftModelProposer(PlainStepNextTokens, DrafterGraphs, DraftModelProposer):
    """Drafting with a separate small model (vLLM's ``DraftModelProposer``)."""
