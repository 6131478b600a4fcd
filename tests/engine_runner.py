"""One vLLM engine in its own process: generate, time, count acceptance, print one JSON line.

Both the GPU side-by-side benchmark and the GPU correctness tests run each engine through this
module (in tests/ so that tests import it as ``tests.engine_runner``; benchmarks do the same), so our plugin and vLLM's own CUDA backend are driven by exactly the same code:

    python tests/engine_runner.py '<job json>'

A job is a dict:
    backend      "ours" (our platform plugin) or "native" (``VLLM_PLUGINS=""``: vLLM's own)
    model        checkpoint directory
    engine       extra ``LLM(...)`` keyword arguments (dtype, speculative_config, ...)
    prompts      list of strings, or ``prompt_token_ids``: list of token-id lists
    workloads    instead of prompts: {name: list of strings}, each timed at every batch size
                 in the same engine (results keyed "name:batch")
    max_tokens   output tokens per request (greedy, ``ignore_eos``)
    batches      request counts to time, e.g. [1, 16]: prompts are taken round-robin
    batch1_prompts  batch 1 timed over this many prompts, one request after another in each
                 run (default 1: the first prompt alone, whose one answer decides the cell)
    cell_prompts every batch size b below this count timed over it: ceil(count / b) rounds
                 of b requests, one round after another (default 0: one round of b)
    repeats      timed runs per batch (median reported)
    warmups      untimed runs before them (default 2)
    tokens       true: also return the generated token ids of the first timed run
    sampling     extra ``SamplingParams`` keyword arguments (penalties, ``ignore_eos``, ...;
                 still greedy); ``structured_outputs`` as a dict of ``StructuredOutputsParams``
                 arguments, e.g. ``{"json": schema}``
    env          extra environment variables for the engine's process (e.g. the native
                 backend's model runner: ``{"VLLM_USE_V2_MODEL_RUNNER": "0"}``)

Output: ``RESULT {...}`` with, per batch size, the median wall time, ms/token (wall time over
the tokens one request receives: the latency a user sees per token), tokens/s (all requests),
the decode phase's ms per generated token (below), and the speculative counters over the timed runs
(drafts, draft tokens, accepted tokens, per position), from which the parent derives
acceptance length.

Decode phase: from the moment the last request of the batch has its first token to the moment
the last one has its last, over the tokens generated in between (vLLM's per-request engine
timestamps, ``RequestOutput.metrics``). It leaves out the prefill and each call's start and
end, which ms/token includes: prompts the warm-up put in the prefix cache make the prefill
differ between methods (vLLM's EAGLE path recomputes a block more per hit, session 26).
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time

_SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
}
_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
# Our counter of request-steps by the draft length they verified (adaptive/metrics.py; in an
# offline engine through patch P15); absent on vLLM's own backend, which drafts K every step.
_DRAFT_LENGTH = "vllm:spec_decode_draft_length"


def _spec_counters(llm) -> dict:
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_position": [], "lengths": {}}
    for metric in llm.get_metrics():
        if metric.name in _SPEC_COUNTERS:
            out[_SPEC_COUNTERS[metric.name]] += int(metric.value)
        elif metric.name.startswith(_DRAFT_LENGTH) and "length" in metric.labels:
            length = int(metric.labels["length"])
            out["lengths"][length] = out["lengths"].get(length, 0) + int(metric.value)
        elif metric.name == _PER_POSITION:
            values = [int(v) for v in metric.values]
            merged = out["per_position"] + [0] * (len(values) - len(out["per_position"]))
            out["per_position"] = [a + b for a, b in zip(merged, values + [0] * len(merged))]
    return out


def _delta(after: dict, before: dict) -> dict:
    per_pos = [a - (before["per_position"][i] if i < len(before["per_position"]) else 0)
               for i, a in enumerate(after["per_position"])]
    lengths = {k: v - before["lengths"].get(k, 0) for k, v in after["lengths"].items()}
    return {key: after[key] - before[key] for key in ("drafts", "draft_tokens", "accepted")} | {
        "per_position": per_pos, "lengths": {k: v for k, v in sorted(lengths.items()) if v}}


def reached_acceptance(per_position: list[int], lengths: dict[int, int]) -> list[float] | None:
    """Acceptance at each draft position among the drafts that reached it: accepted tokens at
    position i over the request-steps that drafted at least i tokens (``lengths``: request-steps
    by draft length). With adaptive drafting the plain per-position rate also counts drafts too
    short to reach a position, so it is not comparable with an engine that drafts K every step;
    this is. None where the lengths are unknown (vLLM's own backend: then every draft reaches
    every position, and the plain rate is this one)."""
    if not lengths:
        return None
    out = []
    for i, accepted in enumerate(per_position, start=1):
        reached = sum(n for k, n in lengths.items() if k >= i)
        out.append(accepted / reached if reached else None)
    return out


def requests_for(job: dict, batch: int) -> list:
    """``batch`` requests from the job's prompts (or token-id lists), round-robin."""
    if "prompt_token_ids" in job:
        ids = job["prompt_token_ids"]
        return [{"prompt_token_ids": ids[i % len(ids)]} for i in range(batch)]
    prompts = job["prompts"]
    return [prompts[i % len(prompts)] for i in range(batch)]


def cell_rounds(job: dict, batch: int, prompts: dict | None = None) -> list[list]:
    """What one timed run of a batch size sends: a list of rounds, each one ``generate`` call.
    A batch of n is one round of n requests; batch 1 with ``batch1_prompts`` N is N rounds of
    one request each (the first N prompts in turn), so that one prompt's answer does not
    decide the batch-1 figure. With ``cell_prompts`` N every batch size b below N sends
    ceil(N / b) rounds of b (the prompts round-robin), so that small batches answer as many
    prompts as the largest: one round of 4 prompts took 0.36-0.52 s on the padded 7B, and the
    time outside its decode phase varied by up to 40 ms between runs (session 41).
    ``prompts``: a workload's ``{"prompts": [...]}``, in place of the job's own."""
    source = prompts if prompts is not None else job
    count = max(batch, int(job.get("cell_prompts", 0)))
    if batch == 1:
        count = max(count, int(job.get("batch1_prompts", 1)))
    rounds = -(-count // batch)
    requests = requests_for(source, rounds * batch)
    return [requests[i * batch:(i + 1) * batch] for i in range(rounds)]


def decode_ms_per_token(outputs) -> float | None:
    """The batch's decode phase in ms per generated token (module docstring); None where vLLM
    kept no timestamps (log stats off) or a request generated one token or none."""
    stats = [o.metrics for o in outputs]
    if not stats or any(m is None or m.num_generation_tokens < 2 for m in stats):
        return None
    start = max(m.first_token_ts for m in stats)
    end = max(m.last_token_ts for m in stats)
    steps = max(m.num_generation_tokens for m in stats) - 1
    return 1000.0 * (end - start) / steps


def start_phase_ms(outputs, wall_s: float | None = None) -> dict | None:
    """Where a call's time outside the decode phase goes, from the same engine timestamps
    (all on the engine core's clock); None without them. ``arrival``: from the first request
    queued in the core to the last (how long the caller took to hand the batch over: the core
    starts stepping on the first, so a slow hand-over staggers the prefills); ``first_token``:
    from the first request queued to the last request's first token (hand-over and prefills);
    ``outside_core``: the call's wall time less the core's span from the first queued request
    to the last token (request set-up before it, output handling after; only with
    ``wall_s``, the call's own wall time). Why: at batch 16 on
    the H100 the time outside the decode phase varied 49-135 ms between runs of one engine
    (session 65), as much as the two engines differed."""
    stats = [o.metrics for o in outputs]
    if not stats or any(m is None or not m.queued_ts or not m.first_token_ts for m in stats):
        return None
    queued = min(m.queued_ts for m in stats)
    span = max(m.last_token_ts for m in stats) - queued
    phase = {"arrival": 1000.0 * (max(m.queued_ts for m in stats) - queued),
             "first_token": 1000.0 * (max(m.first_token_ts for m in stats) - queued)}
    if wall_s is not None:
        phase["outside_core"] = 1000.0 * (wall_s - span)
    return phase


def timed_entry(walls: list[float], decode: list, tokens: list[list[int]], batch: int,
                counters: dict | None, start_phases: list | None = None) -> dict:
    """One batch size's figures from its timed runs: the median wall time, ms/token (wall time
    over the tokens one request receives), tokens/s, the decode phase where every run had one,
    and from the speculative counters (None: not read) the acceptance."""
    wall = statistics.median(walls)
    generated = sum(len(t) for t in tokens)
    entry = {"wall_s": wall, "walls_s": walls,
             "ms_per_token": 1000.0 * wall / (generated / batch),
             "tokens_per_s": generated / wall}
    if counters is not None:
        entry["spec"] = counters
    if all(d is not None for d in decode):
        entry["decode_ms_per_token"] = statistics.median(decode)
        entry["decode_ms_per_token_runs"] = decode
    if start_phases and all(p is not None for p in start_phases):
        entry["start_phase_ms"] = {key: statistics.median(p[key] for p in start_phases)
                                   for key in start_phases[0]}
        entry["start_phase_ms_runs"] = start_phases
    if counters is not None and counters["drafts"]:
        entry["acceptance_length"] = 1.0 + counters["accepted"] / counters["drafts"]
        entry["acceptance_per_position"] = [a / counters["drafts"] for a in counters["per_position"]]
        reached = reached_acceptance(counters["per_position"], counters.get("lengths"))
        if reached is not None:
            entry["acceptance_per_reached_position"] = reached
    return entry


def _sampling_arguments(sampling: dict) -> dict:
    """A job's ``sampling`` as ``SamplingParams`` keyword arguments (EOS ignored unless it
    says otherwise: a structured answer ends at its grammar's end)."""
    arguments = {"ignore_eos": True, **sampling}
    if "structured_outputs" in arguments:
        from vllm.sampling_params import StructuredOutputsParams

        arguments["structured_outputs"] = StructuredOutputsParams(
            **arguments["structured_outputs"])
    return arguments


def run_job(job: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    engine = {"seed": 0, "disable_log_stats": False, **job.get("engine", {})}
    started = time.perf_counter()
    llm = LLM(model=job["model"], **engine)
    config = llm.llm_engine.vllm_config
    result = {"platform": type(current_platform).__name__,
              "engine_start_s": round(time.perf_counter() - started, 1),
              "cudagraph_mode": str(config.compilation_config.cudagraph_mode.name),
              "capture_sizes": list(config.compilation_config.cudagraph_capture_sizes or []),
              "async_scheduling": bool(config.scheduler_config.async_scheduling),
              "batches": {}}
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"],
                            **_sampling_arguments(job.get("sampling", {})))
    if "workloads" in job:
        cells = [(f"{name}:{batch}", cell_rounds(job, batch, {"prompts": prompts}), batch)
                 for name, prompts in job["workloads"].items() for batch in job["batches"]]
    else:
        cells = [(str(batch), cell_rounds(job, batch), batch) for batch in job["batches"]]
    for key, rounds, batch in cells:
        # Warm-up with the same shapes as the timed runs. One was not enough on the H100
        # (2026-11-22): our engines' first timed runs were still slower (kernel JIT).
        for _ in range(job.get("warmups", 2)):
            for requests in rounds:
                llm.generate(requests, params, use_tqdm=False)
        before = _spec_counters(llm)
        walls, windows, decode, starts, tokens = [], [], [], [], None
        for _ in range(job.get("repeats", 3)):
            start_clock = time.strftime("%H:%M:%S")  # to place the engine's log lines (JIT)
            t0 = time.perf_counter()
            outputs = [llm.generate(requests, params, use_tqdm=False) for requests in rounds]
            walls.append(time.perf_counter() - t0)
            windows.append([start_clock, time.strftime("%H:%M:%S")])
            phases = [decode_ms_per_token(out) for out in outputs]
            decode.append(None if None in phases else statistics.mean(phases))
            # The first round's hand-over (batch > 1 is one round; batch 1 over several
            # prompts: the first of them, whose own wall time is not kept).
            starts.append(start_phase_ms(outputs[0],
                                         walls[-1] if len(outputs) == 1 else None))
            if tokens is None:
                tokens = [list(o.outputs[0].token_ids) for out in outputs for o in out]
        entry = timed_entry(walls, decode, tokens, batch, _delta(_spec_counters(llm), before),
                            starts)
        entry["prompts_timed"] = len(tokens)
        entry["run_clock_windows"] = windows
        if job.get("tokens"):
            entry["token_ids"] = tokens
        result["batches"][key] = entry
    return result


# The controller's log lines kept per engine (the last ones: its regime changes while timed).
_CONTROLLER_LINES = 300


def drafter_graph_counts(log: str) -> dict:
    """Our drafter graphs (specdec_plugin/spec_decode/drafter_graphs.py) in an engine's or a
    server's log: recorded, recorded while serving, and failed. Padded graphs recorded at
    start-up are summed up in one line; exact-shape ones recorded while serving get a line
    each (a count of those lines alone read 0 in session 49's GPU memory test, whose graphs
    were recorded at start-up)."""
    while_serving = len(re.findall(r"drafter graph recorded", log))
    at_start = sum(int(n) for n in re.findall(r"(\d+) drafter graphs recorded at start-up", log))
    return {"recorded": at_start + while_serving, "recorded_while_serving": while_serving,
            "failed": len(re.findall(r"drafter graph for key .* not recorded", log))}


def run_in_subprocess(job: dict, timeout_s: float = 1200, log_path: str | None = None) -> dict:
    """Run ``job`` in a fresh Python process (vLLM picks its platform once per process)."""
    from specdec_plugin.engine_ports import engine_port_env

    env = dict(os.environ)
    if job["backend"] == "native":
        env["VLLM_PLUGINS"] = ""
    else:
        env.pop("VLLM_PLUGINS", None)
    # Dynamo logs each recompilation (not first compiles): a torch.compile'd function that
    # compiles again while serving stalls a step (vLLM's async computed-token correction did,
    # 0.3-1.0 s on the H100, session 27: patch P14).
    env.setdefault("TORCH_LOGS", "recompiles")
    # Engines started at once must not be handed the same rendezvous port (engine_ports.py).
    env.update(engine_port_env())
    env.update(job.get("env", {}))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), json.dumps(job)], env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    if log_path:
        with open(log_path, "a") as log:
            log.write(f"===== {json.dumps({k: v for k, v in job.items() if k != 'prompt_token_ids'})}\n")
            log.write(proc.stdout[-20000:] + proc.stderr[-20000:])
    # vLLM's capture progress bars name each graph set, e.g. "Capturing CUDA graphs (decode, FULL)".
    captured = sorted(set(re.findall(r"Capturing CUDA graphs \(([^)]*)\)", proc.stderr)))
    # vLLM's JIT monitor (every compile with jit_monitor_verbose): when, and which kernel.
    # vLLM logs to stdout (the capture bars above are tqdm, on stderr).
    output = proc.stdout + proc.stderr
    jit = [{"clock": clock, "kernel": kernel} for clock, kernel in re.findall(
        r"(\d\d:\d\d:\d\d) \[jit_monitor\.py:\d+\] .*? during inference: ([^\s.(]+)",
        output)]
    recompiles = sorted(set(re.findall(r"Recompiling function (\S+)", output)))
    drafter_graphs = drafter_graph_counts(output)
    # The adaptive controller's own account (specdec_plugin/adaptive/): the start-up cost table
    # and each change of regime with its predictions. In the result, so that it comes back
    # with the JSON from a device whose logs are lost with the machine (session 16).
    controller = [line[line.index("specdec_plugin: "):][:400] for line in output.splitlines()
                  if "specdec_plugin: step costs measured" in line
                  or "specdec_plugin: drafter graphs timed" in line
                  or "specdec_plugin: adaptive drafting" in line][-_CONTROLLER_LINES:]
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):]) | {
                "captured": captured, "jit_events": jit, "dynamo_recompiles": recompiles,
                "drafter_graphs": drafter_graphs,
                "controller_log": controller}
    return {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-3000:]}


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    print("RESULT " + json.dumps(run_job(job)), flush=True)
