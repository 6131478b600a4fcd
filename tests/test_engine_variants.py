"""benchmarks/engine_variants.py: the ``METHOD:VARIANT`` names the CPU and paired benchmarks
take, and that every variant sets a variable the plugin reads (a misspelt one would time the
default under the variant's name)."""
from __future__ import annotations

import pytest

from tests.benchmark_scripts import load_benchmark
from tests.test_envs import _readme_table


@pytest.fixture(scope="module")
def variants():
    return load_benchmark("engine_variants")


def test_a_method_name_splits_into_method_and_environment(variants):
    assert variants.split_method("eagle") == ("eagle", {})
    assert variants.split_method("eagle:probe-observed") == (
        "eagle", {"SPECDEC_ADAPTIVE_PROBE_COST": "observed"})
    assert variants.split_method("suffix:probe-table") == (
        "suffix", {"SPECDEC_ADAPTIVE_PROBE_COST": "table"})
    assert variants.split_method("draft_model:static") == ("draft_model", {"SPECDEC_ADAPTIVE": "0"})
    # The default once more, under a name of its own (a second engine in the same run).
    assert variants.split_method("eagle:again") == ("eagle", {})
    method, env = variants.split_method("ngram:step-log")
    # One file per engine process: step_log.py replaces {pid}.
    assert method == "ngram" and env["SPECDEC_STEP_LOG"].endswith("{pid}.jsonl")
    with pytest.raises(ValueError, match="'often'.*static"):
        variants.split_method("ngram:often")


def test_every_variant_sets_a_documented_variable(variants):
    documented = _readme_table()
    assert variants.VARIANT_KEYS and variants.VARIANT_KEYS <= documented, \
        sorted(variants.VARIANT_KEYS - documented)
