"""Suffix decoding under async scheduling in a real engine (SmolLM2, fp32, CPU).

The CPU device has no streams, so async scheduling is off there; ``SPECDEC_SUFFIX_ASYNC=force``
keeps it on: vLLM's async scheduler and the runner's async speculative path run with our host
stand-ins for streams and events (patches/cpu_streams.py), everything in program order. What
this checks is the wiring (the lazy proposer's records, the drafts uploaded and scattered, the
trims, the runner's corrections of ``num_computed_tokens``), not any overlap.

A fixed pattern of draft lengths (tests/forced_draft_lengths.py, runs of k = 0 between drafting
steps) on more requests than fit in a batch, so requests join, leave and are reordered:
- greedy output equals plain decoding;
- every draft equals the synchronous proposer's on the request's history at that step (the
  global tree off, so each request's own tokens decide: checked against a fresh index);
- drafts were made and accepted, and steps after k = 0 were indexed without waiting.
"""
from __future__ import annotations

import gc

import pytest

from tests.environ import environ
from tests.late_drafts_sampling import JSON_SCHEMA, PENALTIES
from tests.prompts import SPEC_PROMPTS
from tests.spec_configs import K

pytestmark = pytest.mark.slow

PROMPTS = SPEC_PROMPTS[8:14]  # code edits, a repeated sentence, lists: suffixes recur
MAX_TOKENS = [40, 24, 48, 32, 40, 28]  # requests finish at different steps
MAX_MODEL_LEN = 1024
SPEC = {"method": "suffix", "num_speculative_tokens": K,
        "suffix_decoding_max_cached_requests": 0}


def _plain_answers(engines, smollm2_path):
    """The requests' sampling parameters and plain decoding's greedy answers to them."""
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    plain = engines.get(smollm2_path, enable_prefix_caching=False)
    return params, [list(o.outputs[0].token_ids) for o in plain.generate(PROMPTS, params)]


# Run in the engine's worker (LLM.collective_rpc, in-process engine).
def _record_drafts(worker):
    runner = worker.model_runner
    lazy = runner._lazy_suffix()
    if lazy is None:
        return None
    apply = type(lazy)._apply
    lazy.recorded = []

    def recording(rec, reserved=None):
        drafts = apply(lazy, rec, reserved)
        for req_id, slots in (reserved or {}).items():
            lazy.recorded.append((req_id, lazy._num_tokens.get(req_id), rec.k, slots,
                                  drafts.get(req_id, [])))
        return drafts

    lazy._apply = recording
    return type(lazy).__name__


def _recorded(worker):
    lazy = worker.model_runner._lazy_suffix()
    return lazy.recorded, (lazy.applied_ready, lazy.waits, lazy.drafting_steps)




@pytest.fixture(scope="module")
def async_run(smollm2_path):
    from vllm import LLM, SamplingParams

    # The engine in this process: every request is added before the first step.
    with environ(SPECDEC_SUFFIX_ASYNC="force", VLLM_ENABLE_V1_MULTIPROCESSING="0"):
        llm = LLM(model=smollm2_path, dtype="float32", max_model_len=MAX_MODEL_LEN, seed=0,
                  max_num_seqs=3, enable_prefix_caching=False, speculative_config=dict(SPEC),
                  scheduler_cls="tests.forced_draft_lengths.ForcedDraftLengthAsyncScheduler")
        try:
            assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling
            assert llm.collective_rpc(_record_drafts) == ["LazySuffixDrafts"]
            params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
                      for n in MAX_TOKENS]
            outs = llm.generate(PROMPTS, params)
            [(recorded, counts)] = llm.collective_rpc(_recorded)
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
    return outs, recorded, counts


def test_greedy_output_equals_plain_decoding(async_run, engines, smollm2_path):
    from vllm import SamplingParams

    outs, _, _ = async_run
    plain = engines.get(smollm2_path, enable_prefix_caching=False)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    want = [list(o.outputs[0].token_ids) for o in plain.generate(PROMPTS, params)]
    assert [list(o.outputs[0].token_ids) for o in outs] == want


def test_drafts_are_the_synchronous_proposers(async_run):
    from specdec_plugin.spec_decode.suffix_index import SuffixIndex

    outs, recorded, (applied_ready, waits, drafting_steps) = async_run
    # Engine request ids are "<counter>-<random>"; the counter names the request.
    tokens = {o.request_id.split("-")[0]: list(o.prompt_token_ids) + list(o.outputs[0].token_ids)
              for o in outs}
    prompt_len = {o.request_id.split("-")[0]: len(o.prompt_token_ids) for o in outs}
    print(f"{len(recorded)} request-drafts at {drafting_steps} drafting steps; {waits} waits, "
          f"{applied_ready} steps indexed without waiting")
    assert drafting_steps > 10 and applied_ready > 10, (drafting_steps, applied_ready)
    drafted = accepted = 0
    for req_id, num_tokens, k, slots, draft in recorded:
        name = req_id.split("-")[0]
        seq, n_prompt = tokens[name], prompt_len[name]
        assert num_tokens is not None and n_prompt < num_tokens <= len(seq)
        index = SuffixIndex(max_tree_depth=24, max_cached_requests=0)
        index.start_request(name, seq[:n_prompt])
        index.add_tokens(name, seq[n_prompt:num_tokens])
        want = index.speculate(name, None, max_spec_tokens=min(k, MAX_MODEL_LEN - num_tokens - 1),
                               max_spec_factor=1.0, min_token_prob=0.1).token_ids[:slots]
        assert draft == want, (req_id, num_tokens, k, slots, draft, want)
        drafted += bool(draft)
        # Accepted: the draft continues the request's own output.
        accepted += bool(draft) and seq[num_tokens:num_tokens + 1] == draft[:1]
    assert drafted > 10 and accepted >= 2, (drafted, accepted)


def test_adaptive_drafting_counts_only_the_drafts_made(engines, smollm2_path, monkeypatch):
    """The adaptive scheduler under async scheduling (what users get): lossless, and the
    counters it learns from count the drafts the proposer made, not the slots it reserved
    (trimmed slots reach it as ``ngram_gpu``'s do)."""
    from tests.engine_pool import counter_delta, counters

    params, want = _plain_answers(engines, smollm2_path)
    # Read when the engine config is built here and by the engine process it starts; callables
    # reach the worker only with insecure serialization.
    monkeypatch.setenv("SPECDEC_SUFFIX_ASYNC", "force")
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    llm = engines.get(smollm2_path, metrics=True, adaptive=True, enable_prefix_caching=False,
                      disable_log_stats=False, speculative_config=dict(SPEC))
    config = llm.llm_engine.vllm_config
    assert config.scheduler_config.async_scheduling
    assert config.scheduler_config.scheduler_cls.endswith("AdaptiveAsyncScheduler")
    assert llm.collective_rpc(_record_drafts) == ["LazySuffixDrafts"]
    before = counters(llm)
    got = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params)]
    delta = {name: counter_delta(before, counters(llm), name) for name in before}
    [(recorded, _)] = llm.collective_rpc(_recorded)
    assert got == want
    made = [draft for *_, draft in recorded]
    print("adaptive:", delta, f"{sum(map(bool, made))} drafts made of {len(made)} reserved")
    assert delta["vllm:spec_decode_num_drafts"] > 0, delta
    # A request's last draft may never be verified; trimmed slots are never counted.
    assert delta["vllm:spec_decode_num_drafts"] <= sum(map(bool, made)), delta
    assert delta["vllm:spec_decode_num_draft_tokens"] <= sum(map(len, made)), delta


# Run in the engine's worker: what ``_padded_drafts`` got and gave, step by step.
def _record_padding(worker):
    runner = worker.model_runner
    pad = type(runner)._padded_drafts
    runner.padding_log = []

    def recording(lazy, reserved, drafts):
        padded = pad(runner, lazy, reserved, drafts)
        runner.padding_log.append((dict(reserved), {r: list(d) for r, d in drafts.items()},
                                   padded, dict(runner._specdec_filler or {})))
        return padded

    runner._padded_drafts = recording
    runner._lazy_suffix()  # decides _suffix_pads
    return runner._suffix_pads


def _padding_log(worker):
    return worker.model_runner.padding_log


def test_uniform_drafts_pad_instead_of_trim(engines, smollm2_path, monkeypatch):
    """SPECDEC_UNIFORM_DRAFTS=1 (the CUDA default) under async scheduling: every reserved slot
    is verified (a short draft is filled with the request's newest token, never trimmed), the
    output is still plain decoding's, and vLLM's counters count the drafts made, not filler."""
    from tests.engine_pool import counter_delta, counters

    params, want = _plain_answers(engines, smollm2_path)
    monkeypatch.setenv("SPECDEC_SUFFIX_ASYNC", "force")
    monkeypatch.setenv("SPECDEC_UNIFORM_DRAFTS", "1")
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    # A distinct max_num_seqs keeps this engine apart from the pool's others (the variables
    # are read at start).
    llm = engines.get(smollm2_path, metrics=True, adaptive=True, enable_prefix_caching=False,
                      disable_log_stats=False, speculative_config=dict(SPEC), max_num_seqs=254)
    assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling
    assert llm.collective_rpc(_record_padding) == [True]
    before = counters(llm)
    got = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params)]
    delta = {name: counter_delta(before, counters(llm), name) for name in before}
    [log] = llm.collective_rpc(_padding_log)
    assert got == want
    made = filled = 0
    for reserved, drafts, padded, filler in log:
        for req_id, slots in reserved.items():
            real = drafts[req_id]
            assert len(padded[req_id]) == slots and padded[req_id][:len(real)] == real
            assert filler.get(req_id, 0) == slots - len(real), (req_id, slots, real, filler)
            made += len(real)
            filled += slots - len(real)
    print("uniform:", delta, f"{made} draft tokens made, {filled} filler slots")
    assert filled > 0 and delta["vllm:spec_decode_num_drafts"] > 0, (filled, delta)
    # Filler is verified but never counted as drafted.
    assert delta["vllm:spec_decode_num_draft_tokens"] <= made, (delta, made)


# Run in the engine's worker: each late step's drafts, where they were written, and what the
# rejection sampler will read as the step's drafts.
def _record_late_writes(worker):
    runner = worker.model_runner
    write = type(runner)._write_late_drafts
    runner.late_log = []

    def recording(reserved):
        meta = runner._suffix_late_meta
        write(runner, reserved)
        order = [r for r in runner.input_batch.req_ids if r in reserved]
        ends = runner.query_start_loc.np[1:runner.input_batch.num_reqs + 1]
        written = {r: runner.input_ids.gpu[int(ends[row]) - reserved[r]:int(ends[row])].tolist()
                   for row, r in enumerate(runner.input_batch.req_ids) if r in reserved}
        # What _sample will read for penalties (gpu_model_runner.py: _get_draft_token_ids_cpu,
        # only kept when a request uses penalties or bad words): nothing writes in between.
        host = None
        if runner._draft_token_req_ids is not None:
            drafts, req_ids = runner._get_draft_token_ids_cpu()
            host = dict(zip(req_ids, drafts))
        runner.late_log.append((order, dict(reserved), written,
                                meta.draft_token_ids.tolist(), host))

    runner._write_late_drafts = recording
    runner._lazy_suffix()
    return runner._suffix_late_on


def _late_log(worker):
    return worker.model_runner.late_log


def test_late_drafts_with_structured_output(engines, smollm2_path, monkeypatch):
    """Requests under a JSON schema beside free ones, with late drafts: every structured answer
    is JSON of the schema, and every answer equals plain decoding's (the grammar's bitmask is
    made by the scheduler before a late step's drafts exist, so a draft slot it did not check
    would show here). First of the tests that share the late engine: its controller then starts
    from its prior and drafts from the first steps, while the short structured answers run."""
    import json

    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    params = [SamplingParams(temperature=0.0, max_tokens=64,
                             structured_outputs=StructuredOutputsParams(json=JSON_SCHEMA))
              if i % 2 == 0 else SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
              for i, n in enumerate(MAX_TOKENS)]
    plain = engines.get(smollm2_path, enable_prefix_caching=False)
    outs = plain.generate(PROMPTS, params)
    want = [list(o.outputs[0].token_ids) for o in outs]
    late, _, late_outs = _late_run(engines, smollm2_path, monkeypatch, params, want)
    # Engine request ids are "<counter>-<random>"; the counter names the request.
    structured = {o.request_id.split("-")[0] for o in late_outs[0::2]}
    in_late_steps = sum(r.split("-")[0] in structured for _, reserved, *_ in late for r in reserved)
    assert in_late_steps > 0, "no structured request verified late drafts"
    for i in range(0, len(PROMPTS), 2):
        assert outs[i].outputs[0].finish_reason == "stop", outs[i].outputs[0].text
        answer = json.loads(outs[i].outputs[0].text)  # equal to the late engine's (above)
        assert set(answer) == {"name", "ok"} and isinstance(answer["ok"], bool), answer
    print(f"late with structured output: {len(late)} steps, {in_late_steps} structured "
          "request-steps")


def test_late_drafts_equal_plain_decoding(engines, smollm2_path, monkeypatch):
    """SPECDEC_SUFFIX_LATE_DRAFTS=1: steps are prepared with placeholder drafts and the drafts
    are written into the prepared input ids and the sampler's draft tokens just before the
    forward pass. Output equals plain decoding's, and what each late step wrote is, in both
    places, the proposer's padded draft."""
    params, want = _plain_answers(engines, smollm2_path)
    late, padding, _ = _late_run(engines, smollm2_path, monkeypatch, params, want)
    made = 0
    for (order, reserved, written, sampler_drafts, _), (_, drafts, padded, _) in zip(late,
                                                                                     padding):
        assert written == {r: padded[r] for r in reserved}
        assert sampler_drafts == [t for r in order for t in padded[r]]
        made += sum(map(len, drafts.values()))
    print(f"late: {len(late)} steps, {made} draft tokens made")
    assert made > 0


def test_late_drafts_reach_penalties(engines, smollm2_path, monkeypatch):
    """Penalties read each verified position's context from the host copy of the drafts
    (``_get_draft_token_ids_cpu`` in vLLM's ``_sample``), which a late step writes in
    ``_model_forward``, after the step's preparation. Greedy with repetition, frequency and
    presence penalties equals plain decoding with the same penalties, and the host copy each
    late step leaves for the sampler is the padded drafts it verifies."""
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **PENALTIES)
              for n in MAX_TOKENS]
    plain = engines.get(smollm2_path, enable_prefix_caching=False)
    want = [list(o.outputs[0].token_ids) for o in plain.generate(PROMPTS, params)]
    late, padding, _ = _late_run(engines, smollm2_path, monkeypatch, params, want)
    checked = 0
    for (_, reserved, _, _, host), (_, _, padded, _) in zip(late, padding):
        assert host is not None, "penalties in use: vLLM keeps the host copy of the drafts"
        for req_id in reserved:
            assert host[req_id] == padded[req_id], (req_id, host[req_id], padded[req_id])
            checked += 1
    print(f"late with penalties: {len(late)} steps, {checked} host drafts checked")
    assert checked > 0


def test_a_late_step_whose_drafts_do_not_fit_fails_no_request(engines, smollm2_path,
                                                              monkeypatch):
    """Late drafts that do not fit the prepared step (a layout the path did not foresee; here
    forced by dropping one draft token from the slots) must not end the engine: that step
    verifies its placeholders, later steps draft before their preparation, and every answer
    still equals plain decoding's. Last of the late tests: it turns the path off in the
    shared engine (and back on at the end)."""
    params, want = _plain_answers(engines, smollm2_path)
    llm = _late_engine(engines, smollm2_path, monkeypatch)
    assert llm.collective_rpc(_misfit_once) == [True]
    try:
        outs = llm.generate(PROMPTS, params)
        [(misfits, late_on)] = llm.collective_rpc(_misfit_report)
    finally:
        llm.collective_rpc(_misfit_undo)
    assert misfits == 1 and late_on is False, (misfits, late_on)
    assert [list(o.outputs[0].token_ids) for o in outs] == want


# Run in the engine's worker: the next late step's slots lose their last token, once.
def _misfit_once(worker):
    from specdec_plugin.spec_decode import suffix_async_runner as module

    runner = worker.model_runner
    slots = module.late_draft_slots
    runner.misfits = 0

    def short(*args):
        positions, tokens = slots(*args)
        if tokens and not runner.misfits:
            runner.misfits += 1
            return positions[:-1], tokens[:-1]
        return positions, tokens

    module.late_draft_slots, module._saved_slots = short, slots
    runner._lazy_suffix()
    return runner._suffix_late_on


def _misfit_report(worker):
    return worker.model_runner.misfits, worker.model_runner._suffix_late_on


def _misfit_undo(worker):
    from specdec_plugin.spec_decode import suffix_async_runner as module

    module.late_draft_slots = module.__dict__.pop("_saved_slots", module.late_draft_slots)
    worker.model_runner._suffix_late_on = True


def _late_engine(engines, smollm2_path, monkeypatch):
    """The engine the late-drafts tests share: suffix under async scheduling with uniform and
    late drafts, forced on the CPU."""
    monkeypatch.setenv("SPECDEC_SUFFIX_ASYNC", "force")
    monkeypatch.setenv("SPECDEC_UNIFORM_DRAFTS", "1")
    monkeypatch.setenv("SPECDEC_SUFFIX_LATE_DRAFTS", "1")
    # Probes every 16 plain steps and no hysteresis: more drafting steps to check.
    monkeypatch.setenv("SPECDEC_ADAPTIVE_PROBE_BUDGET", "0")
    monkeypatch.setenv("SPECDEC_ADAPTIVE_RESUME_GAIN", "0")
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    # A distinct max_num_seqs keeps this engine apart from the pool's others.
    return engines.get(smollm2_path, adaptive=True, enable_prefix_caching=False,
                       speculative_config=dict(SPEC), max_num_seqs=253)


def _late_run(engines, smollm2_path, monkeypatch, params, want):
    """The late-drafts engine's answers to PROMPTS under ``params``, checked against ``want``;
    returns its late steps' and padding's logs for this run, and its outputs."""
    llm = _late_engine(engines, smollm2_path, monkeypatch)
    assert llm.collective_rpc(_record_padding) == [True]  # fresh logs for this run
    assert llm.collective_rpc(_record_late_writes) == [True]
    outs = llm.generate(PROMPTS, params)
    [late] = llm.collective_rpc(_late_log)
    [padding] = llm.collective_rpc(_padding_log)
    assert [list(o.outputs[0].token_ids) for o in outs] == want
    assert len(late) == len(padding) > 0, (len(late), len(padding))
    return late, padding, outs
