"""``vllm serve`` with our plugin against ``vllm serve`` on vLLM's own CUDA backend, measured
by ``vllm bench serve``, one after the other on one machine in one run (issue 15).

Each backend gets the same server: SmolLM2 with the shipped EAGLE-3 drafter (K=3 by default),
the same dtype, lengths and batch limits; vLLM's own backend is the same vLLM with no plugin
loaded (``VLLM_PLUGINS=""``). Our adaptive drafting stays at its default (on) unless
``--ours-env SPECDEC_ADAPTIVE=0``. Against each, ``vllm bench serve`` sends the random dataset
(fixed input/output lengths, ``--ignore-eos``) at a fixed concurrency and request rate after
its warm-up requests; the server's /metrics before and after give the acceptance of exactly
the benchmark's requests (warm-ups included).

    python benchmarks/bench_serve_side_by_side.py --out DIR [--backends ours,native]
        [--dtype bfloat16] [--num-prompts 600] [--max-concurrency 32] [--request-rate inf]
        [--input-len 256] [--output-len 128] [--k 3] [--method eagle3]

Writes to DIR: ``serve_side_by_side.json`` (after each backend, so a cut-short run keeps what
it measured: request and token throughput, TTFT/TPOT/ITL mean and p50/p90/p99, completed and
failed requests, acceptance length and rate, and the ratio ours/native of each), the raw
``bench_<backend>.json`` of ``vllm bench serve``, and each server's log.

On a CPU machine only ``ours`` runs (vLLM has no CPU backend in this wheel): a smoke test of
this script, e.g. ``--backends ours --dtype float32 --num-prompts 8 --max-concurrency 4
--input-len 32 --output-len 16 --num-warmups 1``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)  # the repo: tests/serve_utils.py starts and stops the servers

from tests.serve_utils import VllmServer, metric_totals  # noqa: E402

# Each backend's process environment on top of the caller's (VLLM_PLUGINS as named here).
BACKEND_ENV = {
    "ours": {},  # every plugin: ours is found through its entry point
    "native": {"VLLM_PLUGINS": ""},  # none: vLLM's own platform
}
# What the JSON reports for each backend, from vllm bench serve's result.
THROUGHPUT_KEYS = ("request_throughput", "output_throughput", "total_token_throughput")
LATENCY_METRICS = ("ttft", "tpot", "itl")
PERCENTILES = ("50", "90", "99")
# Smaller is better for latencies: the ratio ours/native is > 1 where ours is slower; for
# throughputs > 1 where ours is faster.
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--backends", default="ours,native",
                   help="comma list, run in this order: " + ", ".join(BACKEND_ENV))
    p.add_argument("--model", default=None, help="target checkpoint (default: SmolLM2, fetched)")
    p.add_argument("--method", default="eagle3", help="shipped drafter kind, or 'none'")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=2048)
    # The same batch limits as tests/gpu/test_serve_memory_gpu.py, so that on the device our
    # server reuses the compilation that test left in vLLM's cache.
    p.add_argument("--max-num-seqs", type=int, default=512)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--num-prompts", type=int, default=600)
    p.add_argument("--num-warmups", type=int, default=32)
    p.add_argument("--max-concurrency", type=int, default=32)
    p.add_argument("--request-rate", default="inf")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ours-env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra environment for our server, e.g. SPECDEC_ADAPTIVE=0")
    p.add_argument("--start-timeout", type=float, default=600.0,
                   help="seconds a server may take to start (the first compiles for minutes)")
    p.add_argument("--bench-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    unknown = set(args.backends) - set(BACKEND_ENV)
    if unknown:
        p.error(f"unknown backends {sorted(unknown)}; known: {sorted(BACKEND_ENV)}")
    for item in args.ours_env:
        if "=" not in item:
            p.error(f"--ours-env wants NAME=VALUE, got {item!r}")
    return args


def speculative_config(args) -> dict | None:
    if args.method == "none":
        return None
    from specdec_plugin.models.drafters import speculative_config as shipped

    return shipped(args.method, args.k)


def serve_args(args) -> list[str]:
    """The same for every backend (only the environment differs)."""
    out = ["--dtype", args.dtype, "--max-model-len", str(args.max_model_len),
           "--max-num-seqs", str(args.max_num_seqs),
           "--max-num-batched-tokens", str(args.max_num_batched_tokens),
           "--seed", str(args.seed),
           # Ignored on our CPU platform (its KV cache has its own size, SPECDEC_CPU_KV_CACHE_GIB).
           "--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    spec = speculative_config(args)
    if spec is not None:
        out += ["--speculative-config", json.dumps(spec)]
    return out


def bench_command(args, server: VllmServer, result_dir: Path, filename: str) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve",
            "--backend", "openai", "--base-url", server.base_url, "--endpoint", "/v1/completions",
            "--model", server.model, "--tokenizer", server.model,
            "--dataset-name", "random", "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--ignore-eos",
            "--num-prompts", str(args.num_prompts), "--num-warmups", str(args.num_warmups),
            "--max-concurrency", str(args.max_concurrency),
            "--request-rate", str(args.request_rate), "--seed", str(args.seed),
            "--percentile-metrics", ",".join(LATENCY_METRICS),
            "--metric-percentiles", ",".join(PERCENTILES),
            "--save-result", "--result-dir", str(result_dir), "--result-filename", filename,
            "--disable-tqdm"]


def acceptance(before: dict, after: dict) -> dict:
    """The speculative counters' change over the run: drafts, draft tokens, accepted tokens,
    acceptance length (1 + accepted per draft: tokens per verification step) and rate."""
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in SPEC_COUNTERS}
    drafts, drafted, accepted = (delta[name] for name in SPEC_COUNTERS)
    return {"drafts": int(drafts), "draft_tokens": int(drafted), "accepted_tokens": int(accepted),
            "acceptance_length": 1 + accepted / drafts if drafts else None,
            "acceptance_rate": accepted / drafted if drafted else None}


def summarize(bench: dict) -> dict:
    """The numbers compared side by side, from vllm bench serve's result JSON."""
    out = {key: bench.get(key) for key in ("completed", "failed", "duration", *THROUGHPUT_KEYS)}
    for metric in LATENCY_METRICS:
        out[f"mean_{metric}_ms"] = bench.get(f"mean_{metric}_ms")
        for p in PERCENTILES:
            out[f"p{p}_{metric}_ms"] = bench.get(f"p{p}_{metric}_ms")
    return out


def ratios(ours: dict, native: dict) -> dict:
    """ours / native for every number both have (and that is not zero for native)."""
    out = {}
    for key, value in ours.items():
        other = native.get(key)
        if isinstance(value, (int, float)) and isinstance(other, (int, float)) and other:
            out[key] = value / other
    return out


def run_backend(args, backend: str, model: str) -> dict:
    env = dict(BACKEND_ENV[backend])
    if backend == "ours":
        env.update(item.split("=", 1) for item in args.ours_env)
    server_env = dict(os.environ)
    server_env.pop("VLLM_PLUGINS", None)
    server_env.update(env)
    server = VllmServer(model, serve_args(args), log_path=args.out / f"server_{backend}.log")
    server.env = server_env
    entry = {"backend": backend, "env": env, "serve_args": serve_args(args)}
    started = time.monotonic()
    server.start()
    try:
        server.wait_ready(args.start_timeout)
        entry["start_s"] = round(time.monotonic() - started, 1)
        before = metric_totals(server.base_url)
        filename = f"bench_{backend}.json"
        command = bench_command(args, server, args.out, filename)
        entry["bench_command"] = " ".join(command)
        proc = subprocess.run(command, capture_output=True, text=True, timeout=args.bench_timeout,
                              cwd=_ROOT)
        (args.out / f"bench_{backend}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            entry["error"] = f"vllm bench serve exited {proc.returncode}"
            entry["bench_tail"] = (proc.stdout + proc.stderr)[-3000:]
            return entry
        entry["bench"] = summarize(json.loads((args.out / filename).read_text()))
        entry["spec"] = acceptance(before, metric_totals(server.base_url))
    except Exception as exc:  # keep what the other backends measured; say what went wrong
        entry["error"] = f"{type(exc).__name__}: {exc}"[-3000:]
    finally:
        entry["exit_code"] = server.stop(60)
        server.kill()
    return entry


def assemble(args, entries: dict) -> dict:
    out = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "speculative_config": speculative_config(args), "backends": entries}
    ours, native = entries.get("ours", {}), entries.get("native", {})
    if "bench" in ours and "bench" in native:
        out["ours_over_native"] = ratios(ours["bench"], native["bench"])
        if ours.get("spec", {}).get("acceptance_length") and native.get("spec", {}).get(
                "acceptance_length"):
            out["ours_over_native"]["acceptance_length"] = (
                ours["spec"]["acceptance_length"] / native["spec"]["acceptance_length"])
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.model is None:
        from specdec_plugin.models import fetch_smollm2

        args.model = str(fetch_smollm2())
    entries: dict = {}
    path = args.out / "serve_side_by_side.json"
    for backend in args.backends:
        print(f"== {backend}", flush=True)
        entries[backend] = run_backend(args, backend, args.model)
        path.write_text(json.dumps(assemble(args, entries), indent=1))
        print(json.dumps({k: v for k, v in entries[backend].items()
                          if k not in ("bench_command", "serve_args")}, indent=1), flush=True)
    result = assemble(args, entries)
    if "ours_over_native" in result:
        print("ours / native:", json.dumps(result["ours_over_native"], indent=1), flush=True)
    failed = [b for b, e in entries.items() if "error" in e or e.get("bench", {}).get("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
