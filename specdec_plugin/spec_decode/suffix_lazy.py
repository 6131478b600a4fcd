"""Suffix decoding under async scheduling: the proposer's index fed lazily, drafts made when a
step needs them (``SPECDEC_SUFFIX_ASYNC``; the runner side is ``suffix_async_runner.py``).

The synchronous proposer (``suffix.py``) reads step t's sampled tokens in ``sample_tokens(t)``,
which under async scheduling would wait for the device right there. Here ``sample_tokens(t)``
only queues a ``StepRecord``: the host copy of the sampled tokens that vLLM already starts for
every async step's output (``AsyncGPUModelRunnerOutput``: a pinned tensor and its event), the
batch's request ids, and which requests joined (with their tokens so far) or left. Records are
applied to the index in order:

- after a step whose successor verifies no drafts (k = 0, the adaptive controller's usual choice
  while drafts miss) nothing waits: its record is applied once its copy has landed
  (``drain(wait=False)``, every step), or at the next drafting step;
- when the next step verifies drafts, ``drafts`` waits for the newest copy (the runner calls it
  at the start of that step's ``execute_model``, the last point before the draft counts fix the
  batch layout) and drafts as the synchronous proposer would have at the end of the previous
  step: the same index updates in the same order (row by row, each request's start and tokens
  and then its draft; the departures a step noticed only after all of that step's drafts),
  the same ``speculate`` arguments. Drafts are therefore the synchronous proposer's, global
  tree included (tests/test_suffix_async.py).

Two things are done in bulk without changing that order: the tries of a record's new requests
are built together first, on several threads without the GIL (``prepare_requests``: a trie is
its own request's, nothing else reads it until its row starts it; ``drafts`` builds them before
it waits for any copy), and a record that drafts
nothing indexes all its rows' tokens in one call at the end (each grows only its own trie).

The record keeps the host tensor vLLM's async output copies into (a fresh pinned tensor per
step on a GPU; on the CPU the sampler's own output, also fresh per step).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class StepRecord:
    req_ids: list[str]  # the step's batch rows
    sampled: object  # host tensor [rows, 1 + drafts]: accepted tokens, then -1
    ready: object  # event: ``sampled`` has landed on the host
    invalid_rows: frozenset[int]  # rows that sampled nothing (a prompt chunk still prefilling)
    # requests first seen at this step: (prompt, output before this step)
    starts: dict[str, tuple[list[int], list[int]]]
    stops: list[str]  # requests that left the batch before this step
    k: int  # draft length the step asked for its successor (0: none)
    # The tries of ``starts``, once built (``LazySuffixDrafts._prepare``); None: not yet.
    prepared: dict | None = None


class LazySuffixDrafts:
    """Wraps the synchronous ``SpecDecSuffixProposer`` (its index and settings)."""

    def __init__(self, proposer, vocab_size: int):
        self.proposer = proposer
        self.index = proposer.index
        self.vocab_size = vocab_size
        self._queue: deque[StepRecord] = deque()
        self._known: set[str] = set()  # started as of the newest queued record
        self._num_tokens: dict[str, int] = {}  # tokens indexed per request, applied records
        self._last_token: dict[str, int] = {}  # each request's newest sampled token, applied
        self._stops_after_drafts: list[str] = []
        # What happened, for tests and logs: records applied without waiting, waits, drafts.
        self.applied_ready = self.waits = self.drafting_steps = 0

    # ---- sample_tokens(t): queue, never wait ----
    def record(self, req_ids: list[str], sampled, ready, invalid_rows, k: int,
               history_of: Callable[[int, str], tuple[list[int], list[int]]]) -> None:
        """``history_of(row, req_id)``: a request's prompt and output before this step, read on
        the host now
        (only for requests not yet started: the first step they sampled in, or their first
        after they left and came back, as the synchronous proposer's ``_start``)."""
        present = set(req_ids)
        stops = [req_id for req_id in self._known if req_id not in present]
        self._known.difference_update(stops)
        starts = {}
        for row, req_id in enumerate(req_ids):
            if row not in invalid_rows and req_id not in self._known:
                starts[req_id] = history_of(row, req_id)
                self._known.add(req_id)
        self._queue.append(StepRecord(list(req_ids), sampled, ready, frozenset(invalid_rows),
                                      starts, stops, max(0, int(k))))

    # ---- applying records ----
    def drain(self, wait: bool) -> None:
        """Apply queued records in order: all of them (``wait``), or those whose copy has
        landed, stopping at the first that has not (order matters)."""
        while self._queue:
            rec = self._queue[0]
            if not wait:
                if not rec.ready.query():
                    return
                self.applied_ready += 1
            else:
                rec.ready.synchronize()
            self._apply(self._queue.popleft())

    def _apply(self, rec: StepRecord, reserved: dict[str, int] | None = None
               ) -> dict[str, list[int]]:
        """Index one step, row by row as the synchronous proposer does; with ``reserved``
        (the next step's slots per request), each of those rows is drafted right after its
        own tokens are indexed, before the rows after it: a later row's start can evict a
        finished request from the global tree, which the earlier rows' drafts still saw."""
        index, p = self.index, self.proposer
        drafts: dict[str, list[int]] = {}
        # The previous step's departures: the synchronous proposer stops them after its drafts.
        for req_id in self._stops_after_drafts:
            if index.has_request(req_id):
                index.stop_request(req_id)
            self._num_tokens.pop(req_id, None)
            self._last_token.pop(req_id, None)
        self._stops_after_drafts = rec.stops
        rows, counts = _accepted(np.asarray(rec.sampled), self.vocab_size)
        drafting = reserved is not None and rec.k > 0
        # Without drafts the rows' tokens go to the index in one call (GIL released) after the
        # loop: they only grow each request's own trie, which nothing else in the loop reads
        # (starts and stops change the global tree, in the same order as before).
        batch_ids: list[str] = []
        batch_tokens: list[list[int]] = []
        # The new requests' tries, built together first (on several threads, GIL released):
        # building reads nothing of the index, and each is started below at its own row.
        prepared = self._prepare(rec)
        for row, req_id in enumerate(rec.req_ids):
            if row in rec.invalid_rows or not counts[row]:
                continue
            tokens = rows[row][:counts[row]]
            if req_id in rec.starts:
                if index.has_cached(req_id):  # the id came back (preempted and resumed)
                    index.evict_cached(req_id)
                if index.has_request(req_id):  # left and came back within one step
                    index.stop_request(req_id)
                prompt, earlier = rec.starts[req_id]
                index.start_prepared(req_id, prepared[req_id])  # start_request + add_tokens
                self._num_tokens[req_id] = len(prompt) + len(earlier)
            num_tokens = self._num_tokens.get(req_id)
            if num_tokens is None:
                continue  # never started (cannot happen: a start comes with a first sample)
            num_tokens += len(tokens)
            self._num_tokens[req_id] = num_tokens
            self._last_token[req_id] = tokens[-1]
            if num_tokens >= p.max_model_len:
                continue  # as the synchronous proposer: neither indexed nor drafted at the cap
            if not drafting:
                batch_ids.append(req_id)
                batch_tokens.append(tokens)
                continue
            index.add_tokens(req_id, tokens)
            if req_id in reserved:
                draft = index.speculate(
                    req_id, None, max_spec_tokens=min(rec.k, p.max_model_len - num_tokens - 1),
                    max_spec_factor=p.max_spec_factor, min_token_prob=p.min_token_prob)
                drafts[req_id] = draft.token_ids[:reserved[req_id]]
        if batch_ids:
            index.add_tokens_batch(batch_ids, batch_tokens)
        return drafts

    def _prepare(self, rec: StepRecord) -> dict:
        """The tries of ``rec``'s new requests, built once (on several threads, GIL released)
        from the histories the record holds: nothing in them waits for the step's copy."""
        if rec.prepared is None:
            starting = list(rec.starts)
            rec.prepared = dict(zip(starting, self.index.prepare_requests(
                [rec.starts[req_id] for req_id in starting]))) if starting else {}
        return rec.prepared

    # ---- the next step verifies drafts ----
    def drafts(self, reserved: dict[str, int]) -> dict[str, list[int]]:
        """Each request's draft for the step that reserved ``reserved[req_id]`` slots for it
        (at most that many tokens; [] where the synchronous proposer would not draft). Waits
        for every queued step's copy; the newest step (the one just before) is the one the
        drafts follow.

        The new requests' tries are built before the first wait, while the device may still
        be running the step whose tokens the drafts need. Why: the probe that follows a batch
        of new requests comes right after their prefill; building 64 tries after that wait put
        the whole build on the path to the batch's first tokens (suffix's run start at batch
        64 was 14.5 ms over plain decoding's on an H200, session 53)."""
        self.waits += bool(self._queue)
        for rec in self._queue:
            self._prepare(rec)
        while len(self._queue) > 1:
            rec = self._queue.popleft()
            rec.ready.synchronize()
            self._apply(rec)
        made: dict[str, list[int]] = {}
        if self._queue:
            rec = self._queue.popleft()
            rec.ready.synchronize()
            made = self._apply(rec, reserved)
            self.drafting_steps += rec.k > 0 and bool(made)
        return {req_id: made.get(req_id, []) for req_id in reserved}

    def last_token(self, req_id: str) -> int:
        """The newest token of ``req_id`` that an applied record sampled (0 if none): after
        ``drafts``, the token the next step's drafts follow."""
        return self._last_token.get(req_id, 0)


def _accepted(sampled: np.ndarray, vocab_size: int) -> tuple[list[list[int]], list[int]]:
    """A rejection-sampler output as lists, and each row's count of accepted tokens (vLLM's
    ``parse_output`` rule: -1 and ids past the vocabulary are placeholders; valid tokens come
    first). One pass over the batch: this runs every step."""
    valid = (sampled != -1) & (sampled < vocab_size)
    counts = np.where(valid.all(axis=1), sampled.shape[1], valid.argmin(axis=1))
    return sampled.tolist(), counts.tolist()
