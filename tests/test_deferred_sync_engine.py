"""Deferred drafter KV sync in a real engine (SmolLM2 + the shipped EAGLE-3 drafter, fp32, CPU).

The same forced schedule of draft lengths (runs of k = 0 between drafting steps,
tests/forced_draft_lengths.py) runs with deferral on and off, on more requests than fit in a
batch, so requests join, leave and are reordered while tokens are kept. Every draft token
must be the same: the deferred passes write the same drafter KV as vLLM's per-step ones (our
CPU kernels compute each row independently of the rows beside it)."""
from __future__ import annotations

import gc
import json
import os

import pytest

from tests.environ import environ
from tests.prompts import SPEC_PROMPTS
from tests.spec_configs import K, spec_config

pytestmark = pytest.mark.slow

PROMPTS = SPEC_PROMPTS[6:12]
MAX_TOKENS = [40, 24, 48, 32, 40, 28]  # requests finish at different steps


# Run in the engine's worker (LLM.collective_rpc).
def _record_drafts(worker):
    runner = worker.model_runner
    drafter = runner.drafter
    propose = type(drafter).propose
    drafter.recorded = []

    def recording(*args, **kwargs):
        drafts = propose(drafter, *args, **kwargs)
        k = kwargs.get("num_speculative_tokens", args[0] if args else None)
        # Request ids are "<counter>-<random>": the counter names the same request in both
        # engines.
        ids = [req_id.split("-")[0] for req_id in runner.input_batch.req_ids]
        drafter.recorded.append((k, ids, drafts.tolist()))
        return drafts

    drafter.propose = recording
    return type(drafter).__name__


def _recorded(worker):
    drafter = worker.model_runner.drafter
    sync = drafter._deferred_sync
    counts = None if sync is None else (sync.deferred_steps, sync.flushes, sync.dropped_tokens)
    padded_k0 = sum(1 for key, entry in drafter._draft_graphs.items()
                    if key[:2] == ("padded", 0) and entry is not None)
    kv_only = sync is not None and sync.kv_writer is not None
    return drafter.recorded, counts, (None if sync is None else sync.depth, padded_k0, kv_only)


_PROPOSERS = {"eagle3": "SpecDecEagleProposer", "eagle": "SpecDecEagleProposer",
              "draft_model": "SpecDecDraftModelProposer"}




def _run(smollm2_path, defer: bool, prefix_caching: bool, graphs: bool = False,
         method: str = "eagle3", step_log_path: str = "", kv_only: bool = True):
    """``graphs``: drafter graphs emulated on the host (tests/drafter_graphs_host_replay.py),
    as on a GPU: padded graphs, and flushes of at most 1+K tokens replaying them.
    ``step_log_path``: the engine writes SPECDEC_STEP_LOG there. ``kv_only``: EAGLE-family
    flushes write the drafter's KV alone (drafter_kv_writer.py) rather than run its pass."""
    from vllm import LLM, SamplingParams

    from specdec_plugin import step_log
    from specdec_plugin.spec_decode.drafter_graphs import DrafterGraphs

    device_for_graphs = DrafterGraphs._device_for_graphs

    if graphs:
        from tests.drafter_graphs_host_replay import HostReplayGraphs

        emulated = HostReplayGraphs()
        DrafterGraphs._device_for_graphs = lambda self, layer: emulated
    # The engine in this process: every request is added before the first step, so both
    # engines see the same batches (an engine process may start stepping after the first).
    try:
        with environ(SPECDEC_DEFER_DRAFTER_SYNC="1" if defer else "0",
                      SPECDEC_KV_ONLY_FLUSH="1" if kv_only else "0",
                      VLLM_ENABLE_V1_MULTIPROCESSING="0", SPECDEC_STEP_LOG=step_log_path):
            step_log.reset_for_tests()  # the engine is in this process: read the variable again
            llm = LLM(model=smollm2_path, dtype="float32", max_model_len=1024, seed=0,
                      max_num_seqs=3, enable_prefix_caching=prefix_caching,
                      speculative_config=spec_config(method, smollm2_path),
                      scheduler_cls="tests.forced_draft_lengths.ForcedDraftLengthScheduler")
            try:
                assert llm.collective_rpc(_record_drafts) == [_PROPOSERS[method]]
                params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
                          for n in MAX_TOKENS]
                outs = llm.generate(PROMPTS, params)
                [(recorded, counts, graph_info)] = llm.collective_rpc(_recorded)
            finally:
                llm.llm_engine.engine_core.shutdown()
                del llm
                gc.collect()
    finally:
        DrafterGraphs._device_for_graphs = device_for_graphs
        step_log.reset_for_tests()
    return [list(o.outputs[0].token_ids) for o in outs], recorded, counts, graph_info


@pytest.fixture(scope="module")
def runs(smollm2_path, tmp_path_factory):
    # Prefix caching on under a scheduler of our tests' own: the flush before a KV block
    # fills is exercised too.
    out = {defer: _run(smollm2_path, defer, prefix_caching=True) for defer in (True, False)}
    log = str(tmp_path_factory.mktemp("step_log") / "steps-{pid}.jsonl")
    # Full flushes, replayed from the padded graphs (KV-only flushes run no pass).
    out["graphs"] = _run(smollm2_path, True, prefix_caching=True, graphs=True, step_log_path=log,
                         kv_only=False)
    out["step_log"] = log.replace("{pid}", str(os.getpid()))
    return out


def _assert_same_drafts(run_on, run_off) -> None:
    """Deferral on against off: the same output, schedule and batches, and every draft token
    equal, with enough steps deferred, flushed and drafted to mean something."""
    tokens_on, recorded_on, counts_on, _ = run_on
    tokens_off, recorded_off, counts_off, _ = run_off
    assert counts_off is None  # SPECDEC_DEFER_DRAFTER_SYNC=0: no deferral built
    deferred_steps, flushes, _ = counts_on
    assert deferred_steps > 20 and flushes > 5, counts_on
    assert tokens_on == tokens_off
    # Same schedule, same batches, and every draft token equal.
    assert [(k, ids) for k, ids, _ in recorded_on] == [(k, ids) for k, ids, _ in recorded_off]
    drafting = [(i, d) for i, (k, _, d) in enumerate(recorded_off) if k > 0]
    assert len(drafting) > 10
    print(f"deferral on: {deferred_steps} steps deferred, {flushes} flushes, {counts_on[2]} "
          f"tokens dropped; {len(drafting)} drafting steps of {len(recorded_off)} compared")
    mismatched = [i for i, d in drafting if recorded_on[i][2] != d]
    assert not mismatched, [(recorded_on[i], recorded_off[i]) for i in mismatched[:3]]


def _plain_tokens(engines, smollm2_path) -> list[list[int]]:
    """The same requests' greedy output without speculation."""
    from vllm import SamplingParams

    plain = engines.get(smollm2_path, enable_prefix_caching=False)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    return [list(o.outputs[0].token_ids) for o in plain.generate(PROMPTS, params)]


def test_drafts_are_the_same_with_deferral_on_and_off(runs):
    # EAGLE-3's flushes write its KV alone (drafter_kv_writer.py), 16 steps deep.
    assert runs[True][3] == (16, 0, True)
    _assert_same_drafts(runs[True], runs[False])


@pytest.fixture(scope="module")
def eagle_runs(smollm2_path):
    return {defer: _run(smollm2_path, defer, prefix_caching=False, method="eagle")
            for defer in (True, False)}


def test_eagle_kv_only_flushes_draft_as_vllm_does(eagle_runs):
    # EAGLE's first layer reads fc over embeddings and hidden states (llama_eagle.py), where
    # EAGLE-3's reads two norms side by side: the writer has one attention input for each.
    assert eagle_runs[True][3] == (16, 0, True)
    _assert_same_drafts(eagle_runs[True], eagle_runs[False])


@pytest.fixture(scope="module")
def draft_model_runs(smollm2_path):
    return {"on": _run(smollm2_path, True, prefix_caching=True, method="draft_model"),
            "off": _run(smollm2_path, False, prefix_caching=True, method="draft_model"),
            "graphs": _run(smollm2_path, True, prefix_caching=True, graphs=True,
                           method="draft_model")}


def test_draft_model_drafts_are_the_same_with_deferral_on_and_off(draft_model_runs, engines,
                                                                  smollm2_path):
    # The draft model inserts the next token after each request's tokens
    # (deferred_sync.inserts_next_token_slot): a flush writes the kept positions and the
    # step's first one, which the step's own pass then writes again with the same token.
    _assert_same_drafts(draft_model_runs["on"], draft_model_runs["off"])
    assert draft_model_runs["on"][0] == _plain_tokens(engines, smollm2_path)


def test_greedy_output_equals_no_speculation(runs, engines, smollm2_path):
    assert runs[True][0] == _plain_tokens(engines, smollm2_path)


def _assert_padded_flushes_draft_as_eager(run_graphs, run_off) -> None:
    """With drafter graphs (emulated on the host, as on a GPU), a request keeps at most 1+K
    tokens and its flush replays the padded k = 0 graph. Against eager, no deferral."""
    tokens, recorded, counts, (depth, padded_k0, kv_only) = run_graphs
    tokens_off, recorded_off, _, _ = run_off
    print(f"graphs: depth {depth}, {padded_k0} padded k = 0 graphs, deferred/flushes/dropped "
          f"{counts}")
    assert depth == K + 1 and padded_k0 > 0 and counts[0] > 20 and counts[1] > 5, counts
    assert not kv_only
    assert tokens == tokens_off
    assert [(k, ids) for k, ids, _ in recorded] == [(k, ids) for k, ids, _ in recorded_off]
    mismatched = [i for i, (k, _, d) in enumerate(recorded_off) if k > 0 and recorded[i][2] != d]
    assert not mismatched, [(recorded[i], recorded_off[i]) for i in mismatched[:3]]


def test_flushes_replayed_from_padded_graphs_draft_as_vllm_does(runs):
    _assert_padded_flushes_draft_as_eager(runs["graphs"], runs[False])


def test_step_log_tells_how_each_drafter_pass_ran(runs):
    """SPECDEC_STEP_LOG (specdec_plugin/step_log.py) in the run with emulated graphs: a line
    per runner call and per drafter pass, and the counts agree with the drafter's own."""
    with open(runs["step_log"]) as f:
        events = [json.loads(line) for line in f]
    _, recorded, (deferred_steps, flushes, _), _ = runs["graphs"]
    kinds = [e["kind"] for e in events]
    drafts = [e for e in events if e["kind"] == "draft"]
    assert len(drafts) == len(recorded)  # every propose call, each logged once
    paths = [e["path"] for e in drafts]
    assert paths.count("deferred") == deferred_steps
    assert kinds.count("flush") == flushes
    # Decode-shaped passes replay padded graphs; prefills draft eagerly.
    assert paths.count("replay_padded") > 10 and "eager" in paths, sorted(set(paths))
    assert [e["k"] for e in drafts] == [k for k, _, _ in recorded]
    assert kinds.count("exec") >= len(drafts) and kinds.count("sample") >= len(drafts)
    assert all(e["ms"] >= 0 for e in events if "ms" in e)
    times = [e["t"] for e in events]
    assert times == sorted(times)


def test_draft_model_padded_graphs_draft_as_vllm_does(draft_model_runs):
    # The draft model's padded layout: fillers become rejected slots after the inserted next
    # token (spec_decode/drafter_padding.py). Padded since session 25; before, its graphs were
    # recorded per exact shape and its passes on a GPU were never deferred.
    _assert_padded_flushes_draft_as_eager(draft_model_runs["graphs"], draft_model_runs["off"])


# The step that finishes the first request starts up to K + 1 positions before its end, and
# vLLM caches a block only once a step starts past it (drafts are not cached at scheduling).
# Ending 2 + K + 1 positions into a block keeps that step past the boundary whatever the draft
# lengths, so the full block before it is cached without deferral. Ending 2 positions in, an
# adaptive engine whose last step started 2 positions before the boundary and accepted every
# draft left that block uncached (CI simulation, session 19: 32 hits where 48 were expected).
END_OFFSET = 2 + K + 1


def _second_turn_prefix_hits(smollm2_path: str, defer: bool) -> tuple[int, int, int, int]:
    """A request, then one whose prompt is the first one's prompt and output (a second chat
    turn), on an adaptive EAGLE-3 engine with prefix caching. Returns the prefix-cache hits
    of the second request (tokens), the first request's computed tokens, the block size and
    the first request's output length."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with environ(SPECDEC_DEFER_DRAFTER_SYNC="1" if defer else "0", SPECDEC_ADAPTIVE="1"):
        llm = LLM(model=smollm2_path, dtype="float32", max_model_len=1024, seed=0,
                  enable_prefix_caching=True, disable_log_stats=False,
                  speculative_config=spec_config("eagle3", smollm2_path))
        try:
            block = llm.llm_engine.vllm_config.cache_config.block_size
            prompt = llm.get_tokenizer().encode(PROMPTS[0])
            # About 60 tokens, ending END_OFFSET positions into a block: the last positions
            # then reach back into the full block before it.
            computed = 4 * block + END_OFFSET
            if computed <= len(prompt) + 30:
                computed = 8 * block + END_OFFSET
            params = SamplingParams(temperature=0.0, max_tokens=computed + 1 - len(prompt),
                                    ignore_eos=True)
            [first] = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params)
            turn = list(first.prompt_token_ids) + list(first.outputs[0].token_ids)

            def hits():
                return sum(int(m.value) for m in llm.get_metrics()
                           if m.name == "vllm:prefix_cache_hits")

            before = hits()
            llm.generate([TokensPrompt(prompt_token_ids=turn)],
                         SamplingParams(temperature=0.0, max_tokens=1))
            return hits() - before, len(turn) - 1, block, len(first.outputs[0].token_ids)
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()


def test_a_finished_requests_last_blocks_leave_the_prefix_cache(smollm2_path):
    # Its last positions may hold drafter KV the worker deferred and never wrote: the adaptive
    # scheduler keeps their blocks from being reused (deferred_sync.uncache_window).
    from specdec_plugin.spec_decode.deferred_sync import DEFAULT_DEPTH

    hits_on, computed, block, _ = _second_turn_prefix_hits(smollm2_path, defer=True)
    hits_off, _, _, _ = _second_turn_prefix_hits(smollm2_path, defer=False)
    window = DEFAULT_DEPTH + K + 1
    print(f"second turn prefix hits: {hits_on} tokens with deferral, {hits_off} without "
          f"({computed} tokens computed, blocks of {block})")
    assert computed % block == END_OFFSET and window > END_OFFSET
    # Every full block of the first turn: vLLM gives up the last one with an EAGLE drafter,
    # our scheduler keeps it (spec_decode/drafter_prefix_cache.py, patch P13).
    assert hits_off == computed // block * block
    # Without the blocks holding the last `window` positions, and no more.
    assert hits_on == (computed - window) // block * block, (hits_on, computed, block)
    assert 0 < hits_on < hits_off
