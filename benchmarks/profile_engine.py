"""Where one engine's decode time goes: a torch-profiler and cProfile look at ``LLM.generate``.

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so both profilers
see the scheduler, the model runner, the drafter and every kernel launch. Prints:

- the wall time of several generate calls after warm-up (is it still falling? then something
  is still compiling),
- host-side totals from the torch profiler: device kernel time, graph launches, kernel launches,
  host<->device copies and synchronisations (a step that waits on the GPU cannot overlap),
- the top operators by self host time and by device time,
- the top Python functions by own time (cProfile; the raw profile in DIR/cprofile.prof),
- the device timeline (``trace_steps.py``) from a pass that profiles device activity alone:
  busy and idle time per step, idle gaps by length, device time per kernel. Two engines'
  summaries diff with ``python benchmarks/trace_steps.py --diff A/summary.json B/summary.json``.
  ``--device-only`` runs only that pass.
- what the host was doing while the device sat idle (``gap_host_activity.py``, from the pass
  that profiles both sides, with the engine core's scheduler calls and its wait for each
  step's output added as ranges).

    python benchmarks/profile_engine.py --backend ours --method eagle --batch 1 --out DIR

``--host-only`` runs the cProfile pass alone (no torch profiler, no vLLM profiling ranges) and
records the profiled call's engine steps: ``cprofile_diff.py DIR_A DIR_B`` then says, per
step, which Python functions one engine spends more host time in than another.

Uses the random 7.24B Llama of the side-by-side benchmark (benchmarks/gpu_models.py) with
synthetic acceptance, or with ``--setup smollm2-padded --small-target DIR --workloads prose``
SmolLM2 padded to 7B on one real workload (real acceptance: n-gram's uneven draft lengths).
Native: ``--backend native`` (``VLLM_PLUGINS=""``, set before vLLM loads).
"""
from __future__ import annotations

import argparse
import cProfile
import gzip
import io
import json
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo


def _args():
    from bench_gpu_side_by_side import add_setup_arguments

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_setup_arguments(p)  # --work, --k, --acceptance-length: what the model setup reads
    p.add_argument("--setup", choices=("llama7b-random", "smollm2-padded"),
                   default="llama7b-random")
    p.add_argument("--small-target", help="SmolLM2 checkpoint directory (smollm2-padded)")
    p.add_argument("--backend", choices=("ours", "native"), default="ours")
    p.add_argument("--method", default="eagle")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--timed", type=int, default=4)
    p.add_argument("--out", required=True)
    p.add_argument("--engine", default="{}", help="extra LLM(...) arguments as JSON")
    p.add_argument("--device-only", action="store_true",
                   help="only the device-timeline pass (no host profiler, no cProfile)")
    p.add_argument("--host-only", action="store_true",
                   help="only the cProfile pass (no torch profiler): the Python host work of "
                   "each function, to diff two engines with cprofile_diff.py")
    return p.parse_args()


def _profiler_summary(prof) -> dict:
    """Totals over the profiled region, by event name."""
    totals: dict[str, dict] = {}
    device_kernel_us = 0.0
    for e in prof.key_averages():
        totals[e.key] = {"count": e.count, "self_cpu_us": e.self_cpu_time_total,
                         "device_us": getattr(e, "self_device_time_total", 0.0)}
        device_kernel_us += getattr(e, "self_device_time_total", 0.0)
    watch = ("cudaGraphLaunch", "cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
             "cudaLaunchKernelExC", "cudaStreamSynchronize", "cudaDeviceSynchronize",
             "cudaEventSynchronize", "cudaMemcpyAsync", "aten::item", "aten::_local_scalar_dense",
             "aten::to", "aten::copy_", "aten::nonzero")
    return {"device_self_total_ms": device_kernel_us / 1000.0,
            "watched": {name: totals[name] for name in watch if name in totals}}


def _write_summary(out: str, result: dict) -> None:
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("SUMMARY " + json.dumps(result))


def _annotate_engine_core(llm) -> None:
    """Profiler ranges around the engine core's own calls (the scheduler's, and the wait for a
    step's output), which vLLM leaves unannotated: without them that host time shows as
    "(no range)" in ``gap_host_activity.py``. The engine core runs in this process."""
    from torch.profiler import record_function

    core = llm.llm_engine.engine_core.engine_core
    scheduler = core.scheduler

    def ranged(name, fn):
        def call(*args, **kwargs):
            with record_function(name):
                return fn(*args, **kwargs)
        return call

    scheduler.schedule = ranged("engine core: schedule", scheduler.schedule)
    scheduler.update_from_output = ranged("engine core: update_from_output",
                                          scheduler.update_from_output)
    executor = core.model_executor
    executor.execute_model = ranged("engine core: execute_model", executor.execute_model)
    sample_tokens = ranged("engine core: sample_tokens", executor.sample_tokens)

    def sample_tokens_waited(*args, **kwargs):
        # The engine core waits on this future for the step's output (an event sync on
        # another thread): name that wait, or it reads as Python in the gaps.
        future = sample_tokens(*args, **kwargs)
        if hasattr(future, "result"):
            future.result = ranged("engine core: wait for output", future.result)
        return future

    executor.sample_tokens = sample_tokens_waited


def _gzip(path: str) -> None:
    with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
        dst.write(src.read())
    os.remove(path)


def _cprofile_pass(llm, requests, params, out: str) -> int:
    """One generate under cProfile: the raw profile in OUT/cprofile.prof (callers and callees
    of any function, and cprofile_diff.py's input), the top functions in OUT/cprofile.txt.
    Returns the engine steps the call took (the diff's per-step divisor)."""
    core = llm.llm_engine.engine_core.engine_core
    steps = [0]
    step = core.step_fn

    def counted(*args, **kwargs):
        outputs, executed = step(*args, **kwargs)
        steps[0] += bool(executed)
        return outputs, executed

    core.step_fn = counted
    profiler = cProfile.Profile()
    profiler.enable()
    llm.generate(requests, params, use_tqdm=False)
    profiler.disable()
    core.step_fn = step
    profiler.dump_stats(os.path.join(out, "cprofile.prof"))
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("tottime").print_stats(45)
    stats.sort_stats("cumulative").print_stats(70)
    with open(os.path.join(out, "cprofile.txt"), "w") as f:
        f.write(f"engine steps in the profiled call: {steps[0]}\n" + stream.getvalue())
    return steps[0]


def main() -> None:
    args = _args()
    os.makedirs(args.out, exist_ok=True)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if not args.host_only:  # runner phases as ranges (in the cProfile pass, only overhead)
        os.environ.setdefault("VLLM_CUSTOM_SCOPES_FOR_PROFILING", "1")
    if args.backend == "native":
        os.environ["VLLM_PLUGINS"] = ""
    import torch
    from bench_gpu_side_by_side import SETUPS
    from tests.engine_runner import requests_for
    from vllm import LLM, SamplingParams

    # The side-by-side benchmark's model, drafters, speculative configs and prompts.
    target, specs, workload = SETUPS[args.setup](args)
    if "workloads" in workload:  # one workload: the first named
        workload = {"prompts": next(iter(workload["workloads"].values())),
                    "engine": workload["engine"]}
    engine = {"dtype": "bfloat16", "max_model_len": 1024, "max_num_seqs": max(args.batch, 1),
              "gpu_memory_utilization": 0.85, "seed": 0, **workload["engine"],
              **json.loads(args.engine)}
    if specs[args.method] is not None:
        engine["speculative_config"] = specs[args.method]
    t0 = time.perf_counter()
    llm = LLM(model=target, **engine)
    start_s = time.perf_counter() - t0
    requests = requests_for(workload, args.batch)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    for _ in range(2):
        llm.generate(requests, params, use_tqdm=False)
    walls = []
    for _ in range(args.timed):
        t = time.perf_counter()
        llm.generate(requests, params, use_tqdm=False)
        walls.append(time.perf_counter() - t)
    ms_per_token = [1000 * w / args.max_tokens for w in walls]
    head = {"backend": args.backend, "method": args.method, "batch": args.batch,
            "engine_start_s": round(start_s, 1), "ms_per_token_runs": ms_per_token,
            "ms_per_token_median": statistics.median(ms_per_token)}
    if args.host_only:
        _write_summary(args.out, {**head, "cprofile_steps": _cprofile_pass(llm, requests, params,
                                                                            args.out)})
        return

    from torch.profiler import ProfilerActivity, profile
    from trace_steps import summarize_trace

    # Device activity alone first: without host-side events the profiler adds little to each
    # launch, so idle gaps on the device are the engine's, not the profiler's.
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate(requests, params, use_tqdm=False)
        torch.cuda.synchronize()
    device_trace = os.path.join(args.out, "trace_device.json")
    prof.export_chrome_trace(device_trace)
    device_timeline = summarize_trace(device_trace, args.max_tokens)
    _gzip(device_trace)
    head["device_timeline"] = device_timeline
    if args.device_only:
        _write_summary(args.out, head)
        return

    _annotate_engine_core(llm)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        llm.generate(requests, params, use_tqdm=False)
        torch.cuda.synchronize()
        profiled_wall = time.perf_counter() - t
    trace = os.path.join(args.out, "trace.json")
    prof.export_chrome_trace(trace)
    from gap_host_activity import attribute
    from trace_steps import _load

    host_in_gaps = attribute(_load(trace), args.max_tokens, min_us=100.0)
    _gzip(trace)
    summary = _profiler_summary(prof)

    steps = _cprofile_pass(llm, requests, params, args.out)
    _write_summary(args.out, {**head, "profiled_wall_ms": profiled_wall * 1000, **summary,
                              "host_in_device_gaps": host_in_gaps, "cprofile_steps": steps})
    print(json.dumps(host_in_gaps, indent=1))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=40))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=35))
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=25))
    with open(os.path.join(args.out, "cprofile.txt")) as f:
        print(f.read()[:12000])


if __name__ == "__main__":
    main()
