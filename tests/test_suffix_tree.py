"""C++ SuffixIndex (csrc/suffix_tree.*) against the pure-Python reference, plus invariants.

Needs specdec_plugin._C; without an installed build the module JIT-compiles csrc/ once
(SPECDEC_JIT_BUILD=1 is defaulted here; ~1.5 min on 2 cores, cached afterwards).
"""
from __future__ import annotations

import os
import random
import time

import numpy as np
import pytest

os.environ.setdefault("SPECDEC_JIT_BUILD", "1")

from specdec_plugin.spec_decode.suffix_index import SuffixIndex  # noqa: E402
from specdec_plugin.spec_decode.suffix_reference import ReferenceSuffixIndex, repetitive_token_stream  # noqa: E402




def _same(a, b, where: str) -> None:
    assert list(a.token_ids) == list(b.token_ids), where
    assert list(a.probs) == list(b.probs), where  # bit-exact: same float ops, same order
    assert a.match_len == b.match_len, where
    assert a.score == b.score, where


@pytest.mark.parametrize(
    "seed,depth,max_cached,alphabet",
    [(0, 1, 2, 3), (1, 2, 0, 3), (2, 4, 1, 4), (3, 7, 3, 5), (4, 24, 2, 6), (5, 3, 5, 2)],
)
def test_matches_reference_on_random_streams(seed, depth, max_cached, alphabet):
    rng = random.Random(seed)
    cpp = SuffixIndex(depth, max_cached)
    ref = ReferenceSuffixIndex(depth, max_cached)
    live: list[str] = []
    next_id = 0
    checked = 0
    for step in range(260):
        op = rng.random()
        if op < 0.12 or not live:
            # Reuse finished ids now and then: stop_request must replace the cached entry.
            rid = str(rng.randrange(next_id + 1)) if rng.random() < 0.3 else str(next_id)
            if rid in live:
                continue
            next_id += 1
            prompt = repetitive_token_stream(rng, rng.randint(0, 40), alphabet)
            cpp.start_request(rid, np.asarray(prompt, dtype=np.int32))
            ref.start_request(rid, prompt)
            live.append(rid)
        elif op < 0.2:
            rid = live.pop(rng.randrange(len(live)))
            cpp.stop_request(rid)
            ref.stop_request(rid)
        elif op < 0.23:
            rid = str(rng.randrange(next_id))
            if rid not in live:
                cpp.evict_cached(rid)
                ref.evict_cached(rid)
        elif op < 0.55:
            rid = rng.choice(live)
            chunk = repetitive_token_stream(rng, rng.randint(1, 6), alphabet)
            cpp.add_tokens(rid, chunk)  # plain list: converted by the binding
            ref.add_tokens(rid, chunk)
        else:
            rid = rng.choice(live)
            ctx = None
            if rng.random() < 0.7:
                ctx = ref._tokens[rid][-depth:]
            elif rng.random() < 0.5:
                ctx = repetitive_token_stream(rng, rng.randint(0, depth + 3), alphabet)  # foreign context
            args = (rng.randint(0, 9), rng.choice([0.0, 0.5, 1.0, 2.5]),
                    rng.choice([0.0, 0.1, 0.34, 1.0]))
            got = cpp.speculate(rid, ctx, *args)
            want = ref.speculate(rid, ctx, *args)
            _same(got, want, f"step {step} req {rid} ctx {ctx} args {args}")
            assert len(got.token_ids) <= args[0]
            checked += 1
        assert cpp.cached_request_ids() == ref.cached_request_ids()
        if step % 40 == 0:
            assert cpp.check_invariants() == ""
            assert cpp.global_num_nodes() == ref.global_trie.num_nodes()
    assert cpp.check_invariants() == ""
    assert cpp.global_num_nodes() == ref.global_trie.num_nodes()
    assert checked > 50


def test_eviction_empties_global_trie():
    idx = SuffixIndex(max_tree_depth=5, max_cached_requests=2)
    rng = random.Random(7)
    for i in range(6):
        idx.start_request(i, repetitive_token_stream(rng, 10, 4))
        idx.add_tokens(i, repetitive_token_stream(rng, 30, 4))
        idx.stop_request(i)
        assert idx.num_cached_requests() == min(i + 1, 2)
        assert idx.check_invariants() == ""
    assert idx.cached_request_ids() == ["4", "5"]
    idx.evict_cached(4)
    idx.evict_cached("5")
    idx.evict_cached("never-seen")  # no-op
    assert idx.num_cached_requests() == 0
    assert idx.global_num_nodes() == 1  # only the root is left: every count was removed
    assert idx.check_invariants() == ""


def test_never_exceeds_max_spec_tokens():
    idx = SuffixIndex(max_tree_depth=16, max_cached_requests=0)
    idx.start_request("r", [1, 2, 3, 4] * 20)
    for k in range(0, 12):
        draft = idx.speculate("r", None, k, max_spec_factor=100.0, min_token_prob=0.0)
        assert len(draft.token_ids) == k
        assert len(draft.probs) == k


def test_repeating_pattern_is_continued_past_the_depth_cap():
    idx = SuffixIndex(max_tree_depth=8, max_cached_requests=0)
    pattern = [11, 12, 13, 14, 15]
    idx.start_request("r", pattern * 6 + pattern[:2])
    draft = idx.speculate("r", None, 12, max_spec_factor=2.0, min_token_prob=0.1)
    # The match is 7 tokens long (depth cap 8), yet the walk continues from shorter suffixes.
    assert draft.match_len == 7
    assert draft.token_ids == (pattern[2:] + pattern * 2)[:12]
    assert all(p == 1.0 for p in draft.probs)
    assert draft.score == 12.0


def test_adaptive_length_follows_match_len():
    idx = SuffixIndex(max_tree_depth=24, max_cached_requests=0)
    idx.start_request("r", [5, 6, 7, 8, 9, 10] + [1, 2] + [5, 6, 7, 8, 9, 10])
    # The last 6 tokens repeat the first 6, whose occurrence is followed by [1, 2]: match 6.
    draft = idx.speculate("r", None, 8, max_spec_factor=0.5, min_token_prob=0.0)
    assert draft.match_len == 6
    assert len(draft.token_ids) == 3  # floor(0.5 * 6)


def test_global_cache_serves_a_repeated_prompt():
    idx = SuffixIndex(max_tree_depth=12, max_cached_requests=4)
    prompt = [100, 101, 102, 103, 104, 105]
    response = [7, 8, 9, 10, 11, 12, 13, 14]
    idx.start_request("a", prompt)
    idx.add_tokens("a", response)
    idx.stop_request("a")
    assert not idx.has_request("a") and idx.has_cached("a")
    idx.start_request("b", prompt)
    draft = idx.speculate("b", prompt, 6, max_spec_factor=1.0, min_token_prob=0.5)
    assert draft.token_ids == response[:6]
    # Without the global cache the prompt alone has nothing to continue.
    solo = SuffixIndex(max_tree_depth=12, max_cached_requests=0)
    solo.start_request("b", prompt)
    assert solo.speculate("b", prompt, 6, 1.0, 0.5).token_ids == []


def test_min_prob_one_stops_at_a_branch():
    idx = SuffixIndex(max_tree_depth=10, max_cached_requests=0)
    # After [9, 1, 2, 3] comes 4 once and 5 once: a 50/50 branch after a certain prefix.
    idx.start_request("r", [9, 1, 2, 3, 4, 0, 9, 1, 2, 3, 5, 0, 9, 1])
    certain = idx.speculate("r", [9, 1], 5, max_spec_factor=10.0, min_token_prob=1.0)
    assert certain.token_ids == [2, 3]
    assert certain.probs == [1.0, 1.0]
    loose = idx.speculate("r", [9, 1], 5, max_spec_factor=10.0, min_token_prob=0.5)
    assert loose.token_ids[:3] == [2, 3, 4]  # tie between 4 and 5: the smaller id wins
    assert loose.probs[2] == 0.5


def test_errors_and_bookkeeping():
    idx = SuffixIndex(max_tree_depth=4, max_cached_requests=3)
    with pytest.raises(KeyError):
        idx.add_tokens("nope", [1])
    with pytest.raises(KeyError):
        idx.speculate("nope", None, 3)
    with pytest.raises(KeyError):
        idx.stop_request("nope")
    idx.start_request(5, [1, 2, 3])
    with pytest.raises(ValueError):
        idx.start_request("5", [1])
    assert idx.has_request("5") and idx.num_active_requests() == 1
    assert idx.active_request_ids() == ["5"]
    idx.stop_request(5)  # no response yet: nothing is cached
    assert idx.num_cached_requests() == 0 and idx.num_active_requests() == 0


def test_batch_matches_single_calls():
    rng = random.Random(3)
    idx = SuffixIndex(max_tree_depth=6, max_cached_requests=8)
    ids = [f"req-{i}" for i in range(5)]
    for rid in ids:
        idx.start_request(rid, repetitive_token_stream(rng, 50, 4))
    ks = [0, 1, 3, 5, 8]
    batch = idx.speculate_batch(ids, ks, 1.5, 0.2)
    assert batch == [idx.speculate(r, None, k, 1.5, 0.2).token_ids for r, k in zip(ids, ks)]
    assert any(batch)


def test_microbenchmark_prints_timings(capsys):
    """Not a performance gate; prints per-call times for a 4k-token context."""
    rng = random.Random(0)
    tokens = repetitive_token_stream(rng, 4096, 64)
    timings = {}
    for name, cls in (("cpp", SuffixIndex), ("python", ReferenceSuffixIndex)):
        idx = cls(24, 100)
        idx.start_request("r", tokens[:4000])
        n_add = 96 if name == "cpp" else 16
        t0 = time.perf_counter()
        for i in range(n_add):
            idx.add_tokens("r", tokens[4000 + i:4001 + i])
        t_add = (time.perf_counter() - t0) / n_add
        n_spec = 2000 if name == "cpp" else 20
        t0 = time.perf_counter()
        for _ in range(n_spec):
            idx.speculate("r", tokens[-24:], 8, 1.0, 0.1)
        timings[name] = (t_add, (time.perf_counter() - t0) / n_spec)
    with capsys.disabled():
        for name, (t_add, t_spec) in timings.items():
            print(f"\n[suffix bench] {name}: add_tokens {t_add * 1e6:.1f} us/token, "
                  f"speculate {t_spec * 1e6:.1f} us/call (4k-token context, depth 24)")
    assert timings["cpp"][1] < timings["python"][1]


def test_add_tokens_batch_equals_one_call_per_request():
    """A step's rows in one call (the plain-step path of both suffix proposers) leave every
    trie as one add_tokens call per request does: the same drafts from random streams."""
    rng = random.Random()
    one, batch = SuffixIndex(6, 2), SuffixIndex(6, 2)
    ids = [f"r{i}" for i in range(rng.randint(3, 9))]
    for rid in ids:
        prompt = repetitive_token_stream(rng, rng.randint(1, 30), 5)
        one.start_request(rid, prompt)
        batch.start_request(rid, prompt)
    for _ in range(40):
        rows = rng.sample(ids, rng.randint(1, len(ids)))
        chunks = [repetitive_token_stream(rng, rng.randint(1, 4), 5) for _ in rows]
        for rid, chunk in zip(rows, chunks):
            one.add_tokens(rid, chunk)
        batch.add_tokens_batch(rows, chunks)
        for rid in ids:
            _same(one.speculate(rid, None, 5, max_spec_factor=4.0, min_token_prob=0.0),
                  batch.speculate(rid, None, 5, max_spec_factor=4.0, min_token_prob=0.0), rid)
    assert batch.check_invariants() == ""


def test_add_tokens_batch_checks_every_id_before_changing_anything():
    idx = SuffixIndex(4, 0)
    idx.start_request("a", [1, 2, 3])
    before = idx.speculate("a", None, 3, max_spec_factor=4.0, min_token_prob=0.0)
    with pytest.raises(KeyError, match="nope"):
        idx.add_tokens_batch(["a", "nope"], [[1, 2], [3]])
    _same(before, idx.speculate("a", None, 3, max_spec_factor=4.0, min_token_prob=0.0), "a")
    with pytest.raises(ValueError, match="differ in length"):
        idx.add_tokens_batch(["a"], [[1], [2]])


def test_prepared_requests_start_as_start_request_and_add_tokens():
    """Tries built apart (several threads) and started in order equal start_request followed
    by add_tokens of the output so far: the same drafts, from the request's own history and
    from contexts through the global tree."""
    rng = random.Random()
    depth = rng.randint(2, 12)
    one, prepared = SuffixIndex(depth, 3), SuffixIndex(depth, 3)
    # Up to about 8,000 tokens: several threads (one per 1,024 tokens) share the building.
    histories = {f"r{i}": (repetitive_token_stream(rng, rng.randint(0, 400), 6),
                           repetitive_token_stream(rng, rng.randint(0, 8), 6))
                 for i in range(rng.randint(3, 20))}
    for rid, (prompt, output) in histories.items():
        one.start_request(rid, prompt)
        if output:
            one.add_tokens(rid, output)
    built = prepared.prepare_requests(list(histories.values()), threads=rng.randint(2, 8))
    for rid, handle in zip(histories, built):
        prepared.start_prepared(rid, handle)
    assert prepared.check_invariants() == ""
    for rid in histories:
        _same(one.speculate(rid, None, 6, max_spec_factor=4.0, min_token_prob=0.0),
              prepared.speculate(rid, None, 6, max_spec_factor=4.0, min_token_prob=0.0), rid)
        context = repetitive_token_stream(rng, rng.randint(1, depth), 6)
        _same(one.speculate(rid, context, 6, max_spec_factor=4.0, min_token_prob=0.0),
              prepared.speculate(rid, context, 6, max_spec_factor=4.0, min_token_prob=0.0), rid)
    for rid in histories:  # the responses join the global tree alike
        one.stop_request(rid)
        prepared.stop_request(rid)
    assert one.cached_request_ids() == prepared.cached_request_ids()
    assert one.global_num_nodes() == prepared.global_num_nodes()


def test_prepared_request_starts_once_and_only_in_an_index_of_its_depth():
    idx = SuffixIndex(4, 0)
    first, second = idx.prepare_requests([([1, 2, 3], []), ([4, 5], [6])], threads=2)
    idx.start_prepared("a", first)
    with pytest.raises(ValueError, match="already started"):
        idx.start_prepared("b", first)
    with pytest.raises(ValueError, match="already active"):
        idx.start_prepared("a", second)
    with pytest.raises(ValueError, match="another depth"):
        SuffixIndex(5, 0).start_prepared("c", second)
    idx.start_prepared("c", second)
    assert idx.num_active_requests() == 2
