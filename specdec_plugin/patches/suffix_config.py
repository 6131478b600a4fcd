"""P8: suffix decoding without arctic-inference (see the catalog).

vLLM's ``SpeculativeConfig`` refuses ``method="suffix"`` unless the arctic-inference package
is importable, because its own proposer wraps that package. Our proposer uses our C++ index,
so the check is answered by whether our extension loads.
"""
from __future__ import annotations


def _our_suffix_index_available() -> bool:
    from specdec_plugin.spec_decode._native import load_extension

    try:
        load_extension()
    except ImportError:
        return False
    return True


def apply() -> None:
    import vllm.config.speculative as speculative

    speculative.has_arctic_inference = _our_suffix_index_available
