"""P7: the V1 runner builds our proposers (see the catalog).

The runner constructs its drafter from class names looked up at construction time, and checks
the drafter's type with the same names. Rebinding those names to our subclasses makes the
runner build ours and its checks accept them. ``PROPOSERS`` maps each vLLM symbol to ours.
"""
from __future__ import annotations

import importlib

# (vLLM module, class name) -> our class ("module:name")
PROPOSERS: dict[tuple[str, str], str] = {
    ("vllm.v1.spec_decode.ngram_proposer", "NgramProposer"):
        "specdec_plugin.spec_decode.ngram:SpecDecNgramProposer",
    ("vllm.v1.worker.gpu_model_runner", "SuffixDecodingProposer"):
        "specdec_plugin.spec_decode.suffix:SpecDecSuffixProposer",
    ("vllm.v1.worker.gpu_model_runner", "EagleProposer"):
        "specdec_plugin.spec_decode.graphed_proposers:SpecDecEagleProposer",
    ("vllm.v1.worker.gpu_model_runner", "DraftModelProposer"):
        "specdec_plugin.spec_decode.graphed_proposers:SpecDecDraftModelProposer",
}


def _load(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def apply() -> None:
    for (module, name), ours in PROPOSERS.items():
        setattr(importlib.import_module(module), name, _load(ours))
