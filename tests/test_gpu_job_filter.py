"""SPECDEC_GPU_METHODS: the GPU end-to-end test starts only the chosen methods' engines and the
plain baselines they are compared with (tests/gpu/test_spec_decode_gpu.py, _only_methods)."""
from __future__ import annotations

import pytest

from tests.gpu.test_spec_decode_gpu import _only_methods, _Selected

NAMES = ["ours/bfloat16/none", "ours/bfloat16/none-mimo", "ours/float32/none-eager",
         "ours/bfloat16/draft_model", "ours/float32/draft_model-sync",
         "ours/float32/draft_model-adaptive", "ours/float32/draft_model-eager-drafter",
         "native/bfloat16/draft_model", "ours/bfloat16/mtp", "native/bfloat16/mtp",
         "ours/float32/ngram-uniform", "ours/bfloat16/eagle3", "ours/float32/eagle-eager"]


def test_all_jobs_without_a_filter():
    jobs = {name: {} for name in NAMES}
    assert _only_methods(jobs, "") is jobs


def test_one_method_keeps_its_variants_and_the_plain_baseline():
    kept = set(_only_methods({name: {} for name in NAMES}, "draft_model"))
    assert kept == {"ours/bfloat16/none", "ours/bfloat16/draft_model",
                    "ours/float32/draft_model-sync", "ours/float32/draft_model-adaptive",
                    "ours/float32/draft_model-eager-drafter", "native/bfloat16/draft_model"}


def test_mtp_keeps_its_mimo_baseline():
    kept = set(_only_methods({name: {} for name in NAMES}, "mtp,ngram"))
    assert kept == {"ours/bfloat16/none", "ours/bfloat16/none-mimo", "ours/bfloat16/mtp",
                    "native/bfloat16/mtp", "ours/float32/ngram-uniform"}


def test_an_unknown_method_is_refused():
    with pytest.raises(ValueError, match="eagle4"):
        _only_methods({name: {} for name in NAMES}, "eagle4")


def test_a_result_left_out_skips_the_test_that_asks_for_it():
    results = _Selected({"ours/bfloat16/none": {"batches": {}}})
    assert results["ours/bfloat16/none"] == {"batches": {}}
    with pytest.raises(pytest.skip.Exception):
        results["ours/bfloat16/eagle3"]
