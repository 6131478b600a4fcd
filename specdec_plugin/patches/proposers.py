"""P7: the V1 runner builds our n-gram and suffix proposers (see the catalog).

The runner constructs its drafter from class names looked up at construction time. For these two
vLLM's own constructor must not run: the suffix one imports arctic-inference (not installed),
the n-gram one JIT-compiles numba over a 1024 x max_model_len batch. So replacing the drafter
after construction (what spec_decode/runner_drafters.py does for the EAGLE family and the draft
model) is no option here, and the names are rebound to our subclasses instead.
"""
from __future__ import annotations

import importlib

# (vLLM module, class name) -> our class ("module:name")
PROPOSERS: dict[tuple[str, str], str] = {
    ("vllm.v1.spec_decode.ngram_proposer", "NgramProposer"):
        "specdec_plugin.spec_decode.ngram:SpecDecNgramProposer",
    # method "ngram_gpu" (what "ngram" becomes on devices that match on the device): vLLM's
    # constructor compiles its own kernel with Inductor and runs it on a max-size dummy batch.
    ("vllm.v1.worker.gpu_model_runner", "NgramProposerGPU"):
        "specdec_plugin.spec_decode.ngram_device:SpecDecNgramProposerGPU",
    ("vllm.v1.worker.gpu_model_runner", "SuffixDecodingProposer"):
        "specdec_plugin.spec_decode.suffix:SpecDecSuffixProposer",
}


def _load(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def apply() -> None:
    for (module, name), ours in PROPOSERS.items():
        setattr(importlib.import_module(module), name, _load(ours))
