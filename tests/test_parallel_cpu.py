"""Tensor and pipeline parallel through vLLM's own distributed engine, on CPU (gloo).

The same code paths a multi-GPU engine takes (vLLM's process groups, our attention over each
rank's share of the heads, the drafters under TP) run here with one worker process per rank.
SmolLM2 has 9 query heads and 3 KV heads, so TP=3 is the size that divides them; the
draft-model case drafts with SmolLM2 itself at TP=3 (the shipped draft model's MLP does not
split in 3, which the last tests check is refused before loading). fp32 greedy output must be
the same tokens as one worker without speculation. Data parallel has no test here.
"""
from __future__ import annotations

import contextlib
import gc
import threading

import pytest

from tests.engine_pool import counters
from tests.prompts import SPEC_PROMPTS
from tests.spec_configs import spec_config

pytestmark = pytest.mark.slow

PROMPTS = [SPEC_PROMPTS[i] for i in (0, 1, 5, 9)]
MAX_TOKENS = 24


def _greedy_tokens(llm) -> list[list[int]]:
    from vllm import SamplingParams

    outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0),
                           use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


# Shutdowns still under way: an engine's processes take seconds to exit, in which the next
# test's engine can already start. All are waited for at the end of the module.
_STOPPING: list[threading.Thread] = []


@pytest.fixture(scope="module", autouse=True)
def _engines_stopped():
    yield
    while _STOPPING:
        _STOPPING.pop().join()


@contextlib.contextmanager
def _engine(model: str, **kwargs):
    """An engine of its own (several worker processes), shut down as soon as the test ends
    (in a thread: vLLM's own engine monitor shuts down from a thread of its own too)."""
    from vllm import LLM

    llm = LLM(model=model, dtype="float32", max_model_len=1024, seed=0,
              distributed_executor_backend="mp", disable_log_stats=False, **kwargs)
    try:
        yield llm
    finally:
        thread = threading.Thread(target=llm.llm_engine.engine_core.shutdown, daemon=True)
        thread.start()
        _STOPPING.append(thread)
        del llm
        gc.collect()


@pytest.fixture(scope="module")
def single_worker_tokens(smollm2_path, engines) -> list[list[int]]:
    # The session's plain engine (prefix caching off, which these fresh prompts never hit):
    # most modules before this one use it, so it is there already and no other is built.
    return _greedy_tokens(engines.get(smollm2_path, enable_prefix_caching=False))


# The shipped draft model's MLP (512 wide) does not split in 3 (refused before loading, below),
# so the draft-model case drafts with SmolLM2 itself, sharded like the target.
@pytest.mark.parametrize("method", ["eagle3", "draft_model_self"])
def test_tensor_parallel_greedy_equals_one_worker(smollm2_path, single_worker_tokens, method):
    # Greedy speculation gives plain decoding's tokens, so a fault in the sharded target or the
    # sharded drafter shows as a difference from one worker's plain decoding.
    spec = {"speculative_config": spec_config(method, smollm2_path)}
    with _engine(smollm2_path, tensor_parallel_size=3, **spec) as llm:
        assert llm.llm_engine.vllm_config.parallel_config.world_size == 3
        tokens = _greedy_tokens(llm)
        drafts = counters(llm).get("vllm:spec_decode_num_draft_tokens", 0)
    assert tokens == single_worker_tokens
    assert drafts > 0, f"{method}: no draft tokens at TP=3"  # the drafter really ran under TP


def test_pipeline_parallel_greedy_equals_one_worker(smollm2_path, single_worker_tokens):
    with _engine(smollm2_path, pipeline_parallel_size=2) as llm:
        assert llm.llm_engine.vllm_config.parallel_config.pipeline_parallel_size == 2
        assert _greedy_tokens(llm) == single_worker_tokens


def test_pipeline_parallel_with_speculation_is_refused_before_loading(smollm2_path):
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match=r"pipeline_parallel_size=2 with speculative_config\.method="
                                         r"'ngram'.*Fix: shard with tensor_parallel_size"):
        _config(smollm2_path, pipeline_parallel_size=2, speculative_config=spec)


def _config(smollm2_path, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=smollm2_path, dtype="float32", **kwargs).create_engine_config()


def test_draft_model_that_does_not_split_is_refused_before_loading(smollm2_path, tmp_path):
    # The shipped draft (four of SmolLM2's layers since session 35) splits over TP=3 as the
    # target does; the one before it (MLP 512) did not. Such a draft: the shipped one's files
    # with that MLP width in its config (nothing is loaded before the refusal).
    import json
    import os

    from specdec_plugin.models.drafters import drafter_checkpoint

    shipped = drafter_checkpoint("draft_model")
    draft = tmp_path / "draft"
    draft.mkdir()
    for item in shipped.iterdir():
        if item.name != "config.json":
            os.symlink(item, draft / item.name)
    config = json.loads((shipped / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, "intermediate_size": 512}))
    _config(smollm2_path, tensor_parallel_size=3,
            speculative_config=spec_config("draft_model", smollm2_path))  # the shipped: accepted
    spec = {**spec_config("draft_model", smollm2_path), "model": str(draft)}
    with pytest.raises(ValueError, match=r"has intermediate_size=512, which does not split over "
                                         r"tensor_parallel_size=3\. Fix"):
        _config(smollm2_path, tensor_parallel_size=3, speculative_config=spec)


def test_draft_model_at_another_tp_is_refused_before_loading(smollm2_path):
    spec = {**spec_config("draft_model_self", smollm2_path), "draft_tensor_parallel_size": 1}
    with pytest.raises(ValueError, match=r"draft_tensor_parallel_size=1 with tensor_parallel_size=3.*"
                                         r"Fix: set draft_tensor_parallel_size=3"):
        _config(smollm2_path, tensor_parallel_size=3, speculative_config=spec)
