"""Method "ngram" on the device path (spec_decode/ngram_device.py), run on the CPU.

On the CPU the host C++ index is the default; ``SPECDEC_NGRAM_ON_DEVICE=1`` sends a plain
``method: "ngram"`` through vLLM's ``ngram_gpu`` runner path with our proposer and the torch
reference of ``ops/ngram_match`` instead (scheduling stays synchronous: the CPU has no
streams). The GPU run of the same path, with the Triton kernel and async scheduling, is
tests/gpu/test_ngram_device_gpu.py.

Checked: the config maps only where it should; greedy output equals no speculation; the
engine's drafter is ours and drafts are accepted; every draft equals the C++ index's on the
history the kernel saw, and that history is the request's own tokens; the adaptive controller's
per-step length reaches the proposer (0 included) and stays lossless, and the counters it reads
count only the drafts the kernel made (unmatched reserved slots are reported as trimmed).
"""
from __future__ import annotations

import pytest

from specdec_plugin.device.cpu import CpuDevice
from specdec_plugin.device.cuda import CudaDevice
from specdec_plugin.spec_decode.ngram_device import device_ngram_method
from tests.engine_pool import counter_delta, counters
from tests.prompts import SPEC_PROMPTS

K = 3
MAX_TOKENS = 32
PROMPTS = SPEC_PROMPTS[8:14]  # code edits, a repeated sentence, lists: n-grams recur
# prompt_lookup_min 2 (other tests use 1): n-gram engines of other tests are not reused here.
SPEC = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 2,
        "prompt_lookup_max": 3}


@pytest.mark.parametrize("forced,layer,want", [
    (None, CudaDevice, "ngram_gpu"), (None, CpuDevice, "ngram"),
    ("1", CpuDevice, "ngram_gpu"), ("0", CudaDevice, "ngram"),
])
def test_method_follows_the_device_layer(monkeypatch, forced, layer, want):
    if forced is None:
        monkeypatch.delenv("SPECDEC_NGRAM_ON_DEVICE", raising=False)
    else:
        monkeypatch.setenv("SPECDEC_NGRAM_ON_DEVICE", forced)
    user = {"model": "ngram", "num_speculative_tokens": 3}
    got = device_ngram_method(user, layer)
    assert got["method"] == want and "model" not in got
    assert user == {"model": "ngram", "num_speculative_tokens": 3}  # the user's dict untouched
    assert device_ngram_method({"method": "ngram_gpu"}, layer)["method"] == want
    eagle = {"method": "eagle", "model": "x"}
    assert device_ngram_method(eagle, layer) is eagle


def _proposer(min_n=1, max_n=3, k=K, max_model_len=64):
    from types import SimpleNamespace

    import torch

    from specdec_plugin.spec_decode.ngram_device import SpecDecNgramProposerGPU

    config = SimpleNamespace(
        speculative_config=SimpleNamespace(prompt_lookup_min=min_n, prompt_lookup_max=max_n,
                                           num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        scheduler_config=SimpleNamespace(max_num_seqs=4))
    return SpecDecNgramProposerGPU(config, torch.device("cpu"))


def test_step_appends_then_matches_the_steps_length():
    from types import SimpleNamespace

    import numpy as np
    import torch

    from specdec_plugin.spec_decode.ngram_index import ngram_propose_batch

    history = torch.tensor([[5, 6, 7, 8, 5, 6, 0, 0, 0, 0],
                            [9, 9, 4, 9, 9, 0, 0, 0, 0, 0],
                            [3, 1, 2, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.int32)
    num_tokens = torch.tensor([6, 5, 3], dtype=torch.int32)
    # Row 0 accepted 2 tokens (then a rejected slot), row 1 one, row 2 none (still prefilling).
    sampled = torch.tensor([[7, 8, -1], [4, -1, -1], [-1, -1, -1]], dtype=torch.int32)
    batch = SimpleNamespace(num_reqs=3, vocab_size=100)
    no_discard = torch.zeros(3, dtype=torch.bool)

    def step(proposer, k):
        """The runner's calls for one step (gpu_model_runner.py:4992-5016)."""
        tokens = history.clone()
        _, count, valid = proposer.update_token_ids_ngram(sampled, batch, tokens, num_tokens,
                                                          no_discard)
        return tokens, proposer.propose(k, num_tokens, tokens, valid, count)

    proposer = _proposer()
    calls = []
    proposer.match = lambda *args: calls.append(args)  # length 0: no matching at all
    tokens, (drafts, num) = step(proposer, 0)
    # No counts: the runner records no copy event, so the next step does not wait on this one.
    assert drafts.shape == (3, 0) and num is None and not calls
    want_history = [[5, 6, 7, 8, 5, 6, 7, 8], [9, 9, 4, 9, 9, 4], [3, 1, 2]]
    assert [tokens[b, :len(h)].tolist() for b, h in enumerate(want_history)] == want_history
    assert tokens[2, 3:].tolist() == [0] * 7  # nothing written past a row with no samples

    tokens, (drafts, num) = step(_proposer(), 2)  # the step's length: 2 of K=3
    want = ngram_propose_batch(tokens.numpy(), np.array([8, 6, 3]), [0, 1], 1, 3, 2, 64)
    assert drafts.shape == (3, 2)
    assert [drafts[b, :num[b]].tolist() for b in range(2)] == want == [[5, 6], [9, 9]]
    assert num[2] == 0 and (drafts[2] == -1).all()  # no draft while prefilling


def test_trims_ride_on_the_output_the_scheduler_reads():
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

    from specdec_plugin.spec_decode.ngram_device import TRIMMED_DRAFTS, NgramTrimReportMixin

    inner = ModelRunnerOutput(req_ids=["a"], req_id_to_index={"a": 0})

    class AsyncOutput:  # async scheduling: get_output() later returns this object
        _model_runner_output = inner

    class VllmRunner:
        def __init__(self, output):
            self.output = output

        def sample_tokens(self, grammar_output):
            return self.output

    class Runner(NgramTrimReportMixin, VllmRunner):
        def sample_tokens(self, grammar_output):
            self._specdec_trimmed = {"a": 2}  # as _update_states leaves it
            return super().sample_tokens(grammar_output)

    for output in (AsyncOutput(), inner):
        runner = Runner(output)
        runner.sample_tokens(None)
        assert getattr(inner, TRIMMED_DRAFTS) == {"a": 2} and runner._specdec_trimmed is None
        delattr(inner, TRIMMED_DRAFTS)
    Runner(EMPTY_MODEL_RUNNER_OUTPUT).sample_tokens(None)  # the shared empty output: untouched
    assert not hasattr(EMPTY_MODEL_RUNNER_OUTPUT, TRIMMED_DRAFTS)


def _greedy(llm):
    from vllm import SamplingParams

    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                                ignore_eos=True))
    return [list(o.prompt_token_ids) + list(o.outputs[0].token_ids) for o in outs]


# Run in the engine's worker process (LLM.collective_rpc): record what the kernel sees.
def _record_matches(worker):
    drafter = worker.model_runner.drafter
    match = getattr(drafter, "unrecorded_match", drafter.match)
    drafter.unrecorded_match, drafter.recorded, drafter.requested = match, [], []

    def recording(token_ids, num_tokens, active, min_n, max_n, k, max_model_len):
        drafts, count = match(token_ids, num_tokens, active, min_n, max_n, k, max_model_len)
        for b in range(token_ids.shape[0]):
            if bool(active[b]):
                n, c = int(num_tokens[b]), int(count[b])
                drafter.recorded.append((token_ids[b, :n].tolist(), drafts[b, :c].tolist(),
                                         (min_n, max_n, k, max_model_len)))
        return drafts, count

    propose = type(drafter).propose

    def counting(num_speculative_tokens, *args):
        drafter.requested.append(num_speculative_tokens)
        return propose(drafter, num_speculative_tokens, *args)

    drafter.match, drafter.propose = recording, counting
    return type(drafter).__name__


def _recorded(worker):
    drafter = worker.model_runner.drafter
    return drafter.recorded, drafter.requested


@pytest.fixture
def device_ngram_engine(engines, smollm2_path, monkeypatch):
    def get(adaptive: bool, uniform: bool = False):
        # Read in this process when the engine config is built (patch P6), and by the engine
        # process it starts; callables reach the worker only with insecure serialization.
        monkeypatch.setenv("SPECDEC_NGRAM_ON_DEVICE", "1")
        monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        # ``uniform``: SPECDEC_UNIFORM_DRAFTS=1 is set by the caller; a distinct max_num_seqs
        # keeps that engine apart from the others in the pool (it reads the variable at start).
        extra = {"max_num_seqs": 255} if uniform else {}
        llm = engines.get(smollm2_path, metrics=True, adaptive=adaptive,
                          enable_prefix_caching=False, disable_log_stats=False,
                          speculative_config=dict(SPEC), **extra)
        assert llm.llm_engine.vllm_config.speculative_config.method == "ngram_gpu"
        assert llm.collective_rpc(_record_matches) == ["SpecDecNgramProposerGPU"]
        return llm

    return get


def test_device_ngram_is_lossless_and_drafts_like_the_cpp_index(engines, smollm2_path,
                                                                device_ngram_engine):
    from specdec_plugin.spec_decode.ngram_index import ngram_propose_batch

    baseline = _greedy(engines.get(smollm2_path, enable_prefix_caching=False))
    llm = device_ngram_engine(adaptive=False)
    before = counters(llm)
    got = _greedy(llm)
    delta = {name: counter_delta(before, counters(llm), name) for name in before}
    assert got == baseline
    assert delta["vllm:spec_decode_num_accepted_tokens"] > 0, delta

    [(recorded, requested)] = llm.collective_rpc(_recorded)
    assert set(requested) == {K}
    drafted = 0
    for history, draft, (min_n, max_n, k, max_model_len) in recorded:
        # The device history is the request's own tokens (prompt, then accepted output).
        assert any(seq[: len(history)] == history for seq in got), history
        [want] = ngram_propose_batch(__import__("numpy").asarray([history], dtype="int32"),
                                     [len(history)], [0], min_n, max_n, k, max_model_len)
        assert draft == want, (history, draft, want)
        drafted += bool(draft)
    assert drafted >= len(PROMPTS), (drafted, len(recorded))


def test_adaptive_lengths_reach_the_device_proposer(engines, smollm2_path, device_ngram_engine):
    baseline = _greedy(engines.get(smollm2_path, enable_prefix_caching=False))
    llm = device_ngram_engine(adaptive=True)
    before = counters(llm)
    assert _greedy(llm) == baseline
    delta = {name: counter_delta(before, counters(llm), name) for name in before}
    assert delta["vllm:spec_decode_num_drafts"] > 0, delta
    [(recorded, requested)] = llm.collective_rpc(_recorded)
    # Every length the proposer was asked for is one the controller may choose.
    assert requested and set(requested) <= set(range(K + 1)), requested
    print("draft lengths asked of the device proposer:", sorted(set(requested)))
    # The counters (and the controller) see the drafts the kernel made, as with the host index,
    # not the slots reserved for every request (NgramTrimReportMixin): at most what was matched
    # (a request's last draft is never verified).
    drafts = [draft for _, draft, _ in recorded]
    assert any(not d for d in drafts), "every request always matched: the check is vacuous"
    assert delta["vllm:spec_decode_num_drafts"] <= sum(map(bool, drafts)), delta
    assert delta["vllm:spec_decode_num_draft_tokens"] <= sum(map(len, drafts)), delta


# Run in the engine's worker: count the slots the runner trimmed and those it filled.
def _record_slots(worker):
    runner = worker.model_runner
    runner.slot_log = {"trimmed": 0, "filler": 0}
    filler_of_last_step = runner._filler_of_last_step
    sample_tokens = runner.sample_tokens

    def counting_filler():
        filler = filler_of_last_step()
        runner.slot_log["filler"] += sum(filler.values())
        return filler

    def counting_sample(*args, **kwargs):
        runner.slot_log["trimmed"] += sum((runner._specdec_trimmed or {}).values())
        return sample_tokens(*args, **kwargs)

    runner._filler_of_last_step, runner.sample_tokens = counting_filler, counting_sample
    return runner.drafter.pad_to_k


def _slots(worker):
    return worker.model_runner.slot_log


def test_uniform_device_drafts_verify_filler_not_trim(engines, smollm2_path, device_ngram_engine,
                                                      monkeypatch):
    """SPECDEC_UNIFORM_DRAFTS=1: unmatched slots are verified with filler (never trimmed), the
    output is unchanged, and vLLM's counters count the kernel's drafts, not the filler."""
    baseline = _greedy(engines.get(smollm2_path, enable_prefix_caching=False))
    monkeypatch.setenv("SPECDEC_UNIFORM_DRAFTS", "1")
    # This engine turns drafting off after its first drafts miss, so it drafts only in the
    # controller's probes; on this CPU a probe at batch 6 costs about half a plain step more
    # (the cost table), and the default probe budget would put the first one past these 32
    # tokens. The fixed interval (16 steps) keeps probes in the run.
    monkeypatch.setenv("SPECDEC_ADAPTIVE_PROBE_BUDGET", "0")
    llm = device_ngram_engine(adaptive=True, uniform=True)
    assert llm.collective_rpc(_record_slots) == [True]
    before = counters(llm)
    assert _greedy(llm) == baseline
    delta = {name: counter_delta(before, counters(llm), name) for name in before}
    [slots] = llm.collective_rpc(_slots)
    [(recorded, _)] = llm.collective_rpc(_recorded)
    assert slots["trimmed"] == 0 and slots["filler"] > 0, slots
    matched = [draft for _, draft, _ in recorded]
    assert 0 < delta["vllm:spec_decode_num_draft_tokens"] <= sum(map(len, matched)), delta
    assert delta["vllm:spec_decode_num_accepted_tokens"] <= delta["vllm:spec_decode_num_draft_tokens"]
