"""vLLM's V1 drafters that replay their steps from our graphs (see drafter_graphs.py).

The runner installs these after its constructor (spec_decode/runner_drafters.py). On a device without graphs they behave exactly as
vLLM's classes.
"""
from __future__ import annotations

from vllm.v1.spec_decode.draft_model import DraftModelProposer
from vllm.v1.spec_decode.eagle import EagleProposer

from specdec_plugin.spec_decode.drafter_graphs import DrafterGraphs


class SpecDecEagleProposer(DrafterGraphs, EagleProposer):
    """EAGLE, EAGLE-3 and MTP drafting (vLLM's ``EagleProposer``)."""


class SpecDecDraftModelProposer(DrafterGraphs, DraftModelProposer):
    """Drafting with a separate small model (vLLM's ``DraftModelProposer``)."""
