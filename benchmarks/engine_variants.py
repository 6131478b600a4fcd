"""Engine variants a benchmark can time beside the default in one run: ``METHOD:VARIANT`` names
the method's engine started with the variant's environment (read where the engine starts).

    static           the adaptive controller off: K drafts every step
    observed         the cost table corrected by observed step times (adaptive/observed_cost.py)
    probe-observed   the probe budget priced by what probes were seen to cost
                     (adaptive/probe_cost.py; the CUDA default since session 54)
    probe-table      the probe budget priced by the start-up cost table (the default on
                     the CPU, and on CUDA before session 54)
    again            the default, as an engine of its own: timed once more in the same run,
                     it tells what an engine's start order or its place on the host moves
                     from what a variant's setting does (session 50: the second of two
                     engines ran every step 4-7% slower than the first, steps that draft
                     nothing included, in two leases)
    full-bookkeeping vLLM's async speculative bookkeeping after steps that verified no drafts
                     too (SPECDEC_LEAN_PLAIN_STEPS=0, worker/plain_step_bookkeeping.py)
    full-inputs      vLLM's per-step input ids and index uploads for uniform steps too
                     (SPECDEC_LEAN_STEP_INPUTS=0, worker/uniform_step_inputs.py)
    step-log         the default with SPECDEC_STEP_LOG on (one file per engine process under
                     the temporary directory's specdec_step_logs/): what the diagnostic log
                     itself costs. Session 52: n-gram at batch 1 read 1.024 of plain decoding
                     with step logs in both engines and 1.008 without, in two leases (each
                     event then written as it happened; now held in memory); this variant
                     puts the two in one run

Used by bench_spec_cpu.py and bench_paired_plain.py.
"""
from __future__ import annotations

import os
import tempfile

VARIANTS: dict[str, dict[str, str]] = {
    "": {},
    "static": {"SPECDEC_ADAPTIVE": "0"},
    "observed": {"SPECDEC_ADAPTIVE_OBSERVED_COST": "1"},
    "probe-observed": {"SPECDEC_ADAPTIVE_PROBE_COST": "observed"},
    "probe-table": {"SPECDEC_ADAPTIVE_PROBE_COST": "table"},
    "again": {},
    "full-bookkeeping": {"SPECDEC_LEAN_PLAIN_STEPS": "0"},
    "full-inputs": {"SPECDEC_LEAN_STEP_INPUTS": "0"},
    "step-log": {"SPECDEC_STEP_LOG": os.path.join(tempfile.gettempdir(), "specdec_step_logs",
                                                  "variant_{pid}.jsonl")},
}

# Every variable a variant sets: a run that sets one for an engine restores them all after.
VARIANT_KEYS = frozenset(key for env in VARIANTS.values() for key in env)


def split_method(name: str) -> tuple[str, dict[str, str]]:
    """``METHOD[:VARIANT]`` -> (METHOD, the variant's environment). An unknown variant's error
    names it and the known ones."""
    method, _, variant = name.partition(":")
    if variant not in VARIANTS:
        raise ValueError(f"{name!r}: unknown variant {variant!r}; variants are "
                         f"{', '.join(sorted(VARIANTS)[1:])}")
    return method, VARIANTS[variant]
