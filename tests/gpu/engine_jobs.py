"""The GPU test files' common harness: run a dict of engine jobs (tests/engine_runner.py),
several engines at a time on one GPU, and read their single-batch results."""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

# Engines started at once on the GPU (each asks for a small share of its memory).
PARALLEL_ENGINES = int(os.environ.get("SPECDEC_GPU_PARALLEL", "6"))


def run_jobs(jobs: dict[str, dict], default_log: str) -> dict[str, dict]:
    """Every job's result by name; the engines' output goes to ``SPECDEC_GPU_LOG`` (or
    ``default_log``), the results also to ``SPECDEC_GPU_REPORT`` when set."""
    from tests.engine_runner import run_in_subprocess

    log = os.environ.get("SPECDEC_GPU_LOG", default_log)
    with ThreadPoolExecutor(PARALLEL_ENGINES) as pool:
        futures = {name: pool.submit(run_in_subprocess, job, 1500, log)
                   for name, job in jobs.items()}
        out = {name: future.result() for name, future in futures.items()}
    save_report(out)
    return out


def save_report(results: dict) -> None:
    """Add ``results`` to the JSON file ``SPECDEC_GPU_REPORT`` names, if set. Added, not
    overwritten: one pytest run of several GPU test files shares the file (session 16's lease
    kept only the last file's engines)."""
    path = os.environ.get("SPECDEC_GPU_REPORT")
    if not path:
        return
    report = {}
    if os.path.exists(path):
        with open(path) as f:
            report = json.load(f)
    report.update(results)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


def single_batch(results: dict, name: str) -> dict:
    """The one batch entry of job ``name`` (its failure, if it failed, in the message)."""
    result = results[name]
    assert "error" not in result, f"{name}: {result.get('error')} {result.get('stderr_tail')}"
    [entry] = result["batches"].values()
    return entry


def count_equal(a: list, b: list) -> int:
    return sum(x == y for x, y in zip(a, b))
