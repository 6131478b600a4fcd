"""Time the target's and the drafter's forward passes at engine start, on the device.

Runs in every worker after graph capture (all tensor-parallel ranks run the same passes in
lockstep, since each pass holds collectives); rank 0 writes the table for the scheduler
(``handoff.py``). Token counts go up from 1, smallest first (the common decode sizes), until
the largest verification batch or the time budget is reached; the cost model extrapolates
past the last point along its slope.

The target is timed through vLLM's own ``_dummy_run`` as a uniform decode batch, which
replays the captured full graph of that size where one exists (``graphs.py``), with the
drafter's part of ``_dummy_run`` switched off; the drafter through its own ``dummy_run``, one
forward pass per call. Wall time after a device synchronisation: what a step costs the engine,
host work included.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time

import numpy as np

from specdec_plugin.adaptive.config import (
    adaptive_enabled,
    times_draft_graphs,
    times_every_length,
)
from specdec_plugin.adaptive.cost_model import CostTable
from specdec_plugin.adaptive.handoff import write_cost_table
from specdec_plugin.log import init_logger

logger = init_logger(__name__)

REPEATS = 3


def token_counts(max_reqs: int, query_len: int, max_tokens: int) -> list[int]:
    """Powers of two up to the request limit (plain decode batches), then n*(1+K) for powers of
    two n (verification batches), up to ``max_tokens``."""
    counts, n = set(), 1
    while n <= max_reqs:
        counts.add(n)
        counts.add(n * query_len)
        n *= 2
    counts.add(min(max_reqs, max_tokens // query_len) * query_len)
    return sorted(c for c in counts if 0 < c <= max_tokens)


def length_points(max_reqs: int, query_len: int, max_tokens: int) -> dict[int, int]:
    """n*q tokens for the draft lengths between none and K (q = 2..K tokens per request), n the
    powers of two up to the request limit, each with the query length to time it at
    (``SPECDEC_ADAPTIVE_TABLE_LENGTHS``). Why: between n and n*(1+K) tokens the table otherwise
    interpolates linearly, while a step's time on a graph device follows the captured graph of
    its own length, and the GEMMs' cost bends where they stop being memory-bound (on the H200
    of session 37: 6.82 ms at 160 tokens, 9.70 at 320; 256 tokens, batch 64 drafting 3, was
    never timed)."""
    points, n = {}, 1
    while n <= max_reqs:
        for q in range(2, query_len):
            if n * q <= max_tokens:
                points.setdefault(n * q, q)
        n *= 2
    return points


@contextlib.contextmanager
def _without_drafter_pass(runner):
    drafter = getattr(runner, "drafter", None)
    if drafter is None or not hasattr(drafter, "dummy_run"):
        yield
        return
    drafter.dummy_run = lambda *args, **kwargs: None  # instance attribute shadows the method
    try:
        yield
    finally:
        del drafter.dummy_run


@contextlib.contextmanager
def _one_drafter_pass(drafter):
    saved = drafter.num_speculative_tokens
    drafter.num_speculative_tokens = 1
    try:
        yield
    finally:
        drafter.num_speculative_tokens = saved


def _seconds(fn, sync) -> float:
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def _fastest_in_rounds(parts, counts: list[int], budget_s: float, sync) -> tuple[list[int], list[list[float]]]:
    """Each part's fastest of REPEATS timed runs at each token count, the runs taken in rounds
    over all counts rather than back to back, and the counts cut where the budget runs out.

    The fastest, not the median: on a busy host (an API server, a tokenizer or another job
    sharing the cores) most runs of a few-millisecond CPU step can be stretched by preemption,
    and one stretched point, raised into every larger size by the fix-up that ``monotone``
    replaced, told the controller that no draft pays: a CI simulation at load ~15 served an
    n-gram engine with zero drafts. The fastest run is the step's own cost.

    In rounds: a slow spell of the host lasts longer than a few runs, and with a count's runs
    back to back it stretched every run of one count. A test engine on 2 cores (2026-11-27)
    read 180 ms for 32 tokens where the next start read 116 ms (16 tokens: 81 and 75 ms); at
    batch 8 with every draft accepted the first then drafted 1 token instead of 3. Spread over
    rounds, a count's runs fall in different moments, and one of them misses the spell.

    Round 1 runs each count's warm-up (the first use of a size may compile or allocate) and
    first timing, from the smallest count up, and stops at the count where the budget, scaled
    to the whole measurement (two of the REPEATS + 1 runs per count), is spent."""
    counts_done: list[int] = []
    times: list[list[float]] = [[] for _ in parts]
    started = time.perf_counter()
    share = 2.0 / (REPEATS + 1)
    for t in counts:
        for part, row in zip(parts, times):
            part(t)  # warm-up
            sync()
            row.append(_seconds(lambda: part(t), sync))
        counts_done.append(t)
        if time.perf_counter() - started > budget_s * share:
            break
    for round_ in range(1, REPEATS):
        # Every other round from the largest count down: a spell at one end of a round does
        # not fall on the same counts each time.
        order = range(len(counts_done))
        for i in (reversed(order) if round_ % 2 else order):
            for part, row in zip(parts, times):
                row[i] = min(row[i], _seconds(lambda: part(counts_done[i]), sync))
    return counts_done, times


def monotone(times: list[float]) -> list[float]:
    """``times`` (by increasing token count) made non-decreasing, each lowered to the smallest
    time measured at as many tokens or more. Timing noise only ever adds time, so the smaller
    of two times is the better one. The earlier fix-up raised each time to the largest at fewer
    tokens instead, which carried one slow point into every larger size: an H100 EAGLE-3 engine
    of session 17 read 0.78 ms for every drafter size (its first point, 1 token, and no later
    point above it) where two engines beside it read 0.24-0.46 ms; the controller then expected
    drafting to pay too little and kept it off on prose at batch 1 (1.05x of plain decoding;
    the engine beside it, 0.38-0.46 ms and no resume margin, read 0.78x)."""
    return list(np.minimum.accumulate(np.asarray(times, dtype=float)[::-1])[::-1])


def measure_cost_table(run_target, run_drafter, counts: list[int], budget_s: float,
                       sync, drafter_sync_every: int = 1, run_target_logits=None,
                       run_drafter_sample=None) -> CostTable:
    """``run_target_logits(t)``: the target's LM head and argmax over t rows, added to its
    forward pass (a verification computes logits at every token it checks);
    ``run_drafter_sample(t)``: the drafter's, paid once per draft token."""
    started = time.perf_counter()
    parts = {"target": run_target, "logits": run_target_logits, "drafter": run_drafter,
             "sample": run_drafter_sample}
    parts = {name: run for name, run in parts.items() if run is not None}
    measured, rows = _fastest_in_rounds(list(parts.values()), counts, budget_s, sync)
    rows = dict(zip(parts, rows))
    target_s = rows["target"]
    if "logits" in rows:
        target_s = [a + b for a, b in zip(target_s, rows["logits"])]
    drafter_s, sample_s = rows.get("drafter", []), rows.get("sample", [])
    target_s, drafter_s, sample_s = (monotone(s) for s in (target_s, drafter_s, sample_s))
    table = CostTable(tuple(measured), tuple(target_s),
                      tuple(drafter_s) if run_drafter is not None else None,
                      drafter_syncs_at_zero=run_drafter is not None,
                      drafter_sync_every=drafter_sync_every,
                      drafter_sample_s=tuple(sample_s) if run_drafter_sample is not None else None)
    logger.info("specdec_plugin: step costs measured in %.1f s (tokens:ms) target %s%s",
                time.perf_counter() - started,
                " ".join(f"{c}:{s * 1e3:.2f}" for c, s in zip(measured, target_s)),
                "" if run_drafter is None else "; drafter pass " + " ".join(
                    f"{c}:{s * 1e3:.2f}" for c, s in zip(measured, drafter_s))
                + ("" if run_drafter_sample is None else "; drafter LM head + argmax " + " ".join(
                    f"{c}:{s * 1e3:.2f}" for c, s in zip(measured, sample_s))))
    return table


def time_draft_graphs(table: CostTable, run, buckets: list[int], max_k: int, budget_s: float,
                      sync) -> CostTable:
    """``table`` with each draft length's padded drafter graph timed at each padded request
    count (``run(padded, k)``, spec_decode/drafter_graphs.py), fastest of REPEATS in rounds
    as the other parts, each length's times made non-decreasing in the request count."""
    parts = [lambda n, k=k: run(n, k) for k in range(1, max_k + 1)]
    started = time.perf_counter()
    reqs, rows = _fastest_in_rounds(parts, buckets, budget_s, sync)
    rows = [tuple(monotone(row)) for row in rows]
    # One line per length: the engine runner keeps 400 characters of a line (tests/).
    for k, row in enumerate(rows, 1):
        logger.info("specdec_plugin: drafter graphs timed, %d drafts (requests:ms) %s", k,
                    " ".join(f"{n}:{s * 1e3:.3f}" for n, s in zip(reqs, row)))
    logger.info("specdec_plugin: drafter graphs timed in %.1f s", time.perf_counter() - started)
    return dataclasses.replace(table, draft_graph_reqs=tuple(reqs), draft_graph_s=tuple(rows))


def _logits_runner(head, width: int, dtype, device, max_rows: int):
    """``head`` (hidden states -> token ids) over t rows of zeros, or None where it fails once
    (a model without that head): the table then goes without it, as before."""
    import torch

    hidden = torch.zeros(max_rows, width, dtype=dtype, device=device)

    def run(t: int) -> None:
        with torch.inference_mode():
            head(hidden[:t])

    try:
        run(1)
    except Exception as exc:  # the measurement must never fail engine start
        logger.info("specdec_plugin: LM head not timed for the cost table (%s: %s)",
                    type(exc).__name__, exc)
        return None
    return run


def measure_and_publish(runner, vllm_config, rank: int, budget_s: float, sync) -> None:
    """Called by the worker once graphs are captured."""
    if not adaptive_enabled(vllm_config):
        return
    spec = vllm_config.speculative_config
    query_len = 1 + spec.num_speculative_tokens
    max_reqs = runner.max_num_reqs
    graphs = bool(getattr(runner, "_q_dispatchers", None))

    counts = token_counts(max_reqs, query_len, runner.max_num_tokens)
    # Counts added for the other draft lengths: on graph devices those above the request limit
    # are timed in their own length's full graph; those within it as plain batches, as the
    # base counts there are.
    extra = {}
    if times_every_length(spec.method):
        extra = {t: q for t, q in length_points(max_reqs, query_len, runner.max_num_tokens).items()
                 if t not in counts}
        counts = sorted(set(counts) | set(extra))

    def run_target(t: int) -> None:
        with _without_drafter_pass(runner):
            if graphs and t <= max_reqs:
                with runner.adaptive_graph_context(1):
                    runner._dummy_run(t, uniform_decode=True)
            elif graphs and t in extra:
                with runner.adaptive_graph_context(extra[t]):
                    runner._dummy_run(t, uniform_decode=True)
            elif graphs and t % query_len == 0:
                runner._dummy_run(t, uniform_decode=True)
            else:
                runner._dummy_run(t)

    run_drafter = None
    drafter = getattr(runner, "drafter", None)
    if (spec.use_eagle() or spec.uses_draft_model()) and hasattr(drafter, "dummy_run"):
        def run_drafter(t: int) -> None:
            with _one_drafter_pass(drafter):
                drafter.dummy_run(t)

    # vLLM's dummy runs stop at the hidden states. The LM heads were most of what the table
    # missed on the CPU (issue 11: a draft-model step drafting 1 token took 3.3 ms more than a
    # plain one at batch 1, the table said 1.1 ms), so they are timed on their own there.
    # Not yet on graph devices: timed here launch by launch they would not be what a GPU step
    # pays (the drafter's head runs inside its graphs), and the GPU runs behind today's
    # adaptive results (BENCHMARKS.md, session 13) had none of it; measure there first.
    model_config = vllm_config.model_config
    time_heads = not runner.device_layer.supports_graphs
    run_target_logits = run_drafter_sample = None
    if time_heads:
        run_target_logits = _logits_runner(
            lambda h: runner.get_model().compute_logits(h).argmax(dim=-1),
            model_config.get_hidden_size(), model_config.dtype, runner.device, counts[-1])
    if time_heads and run_drafter is not None and hasattr(drafter, "_greedy_sample"):
        run_drafter_sample = _logits_runner(drafter._greedy_sample, drafter.hidden_size,
                                            drafter.dtype, drafter.device, counts[-1])
    # What a drafting step replays on graph devices, where asked for (cost_model.py).
    draft_graphs = None
    if graphs and run_drafter is not None and times_draft_graphs(spec.method):
        timer = getattr(drafter, "padded_draft_timer", None)
        draft_graphs = timer() if timer is not None else None
    try:
        # Deferred drafter passes (spec_decode/deferred_sync.py): one per `depth` plain steps.
        deferred = getattr(drafter, "_deferred_sync", None)
        table = measure_cost_table(run_target, run_drafter, counts, budget_s, sync,
                                   deferred.depth if deferred is not None else 1,
                                   run_target_logits, run_drafter_sample)
    except Exception as exc:  # never fail engine start over a measurement
        logger.warning("specdec_plugin: step-cost measurement failed (%s: %s); adaptive "
                       "drafting uses a fallback cost model", type(exc).__name__, exc)
        return
    if draft_graphs is not None:
        try:
            table = time_draft_graphs(table, *draft_graphs, spec.num_speculative_tokens,
                                      budget_s, sync)
        except Exception as exc:  # the pass-by-pass table still stands
            logger.warning("specdec_plugin: drafter graphs not timed (%s: %s); drafting is "
                           "costed pass by pass", type(exc).__name__, exc)
    if rank == 0:
        write_cost_table(vllm_config, table.to_json())
