"""Replay the adaptive controller on recorded greedy traces, with a modelled step cost: a
model, not a measurement. It answers "what would this policy do to the batch's wall time if
steps cost what the table says", on the CPU, in seconds, for choices that the GPU lease would
otherwise have to settle one engine at a time.

What is real: the prompts and greedy answers (issue 11's real workloads on SmolLM2-135M,
generated here through our plugin on the CPU, float32), the n-gram drafts (our reference
``ngram_match`` over each request's history, ``prompt_lookup_min/max`` 1/4 as the GPU bench),
uniform padding with filler (the request's last token, verified like any draft), and the
controller (``DraftLengthController``: tracker, policy, probes, hysteresis, protection).

What is modelled:
- Step cost: ``CostTable.step_time`` of the table below, for the controller and for the
  clock alike, so the replay isolates what the policy's objective does; a cost the table
  misses (host work, the bias the hysteresis guards against) is not in it.
- The default table models the H100 with SmolLM2 padded to 7B: plain steps of 1 / 4 / 16 / 64
  requests as measured in session 16's lease A (6.9 / 7.2 / 7.4 / 8.4 ms), and 320 tokens
  (batch 64 verifying 4 drafts) extrapolated along the 1-64 slope (14.5 ms). The 320-token
  point was never measured. ``--cost-from RESULT ENGINE`` uses instead the table an engine of
  a GPU bench run measured at its start (from the result's ``controller_log``).
- The controller sees each step's results before choosing the next length (no async lag).

A closed batch, as the GPU bench runs it: every request generates ``--max-tokens``, and the
batch's wall time is the sum of its steps, so the slowest request sets it.

Cells run in the GPU bench's order, each ``--warmups`` + ``--repeats`` times with one controller
per policy (an engine), and the median of the timed runs is reported.

    python benchmarks/replay_controller.py [--traces T.json] [--batches 1,4,16,64] [--out R.json] \
        [--cell-prompts 16] [--base REV] [--cost-from RESULT_JSON ENGINE]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)  # bench_controller_host (--base), real_workloads

K = 4
MIN_N, MAX_N = 1, 4
MAX_MODEL_LEN = 2048
# (tokens per step, seconds): see the module docstring.
H100_PADDED_7B = ((1, 6.9e-3), (4, 7.2e-3), (16, 7.4e-3), (64, 8.4e-3), (320, 14.5e-3))


def measured_table(result_path: str, engine: str):
    """The target's cost table an engine measured at start (n-gram and suffix have no drafter
    model), from a ``bench_gpu_side_by_side.py`` result whose engines carry ``controller_log``:
    the line ``step costs measured in ... (tokens:ms) target 1:6.90 2:7.01 ...``."""
    import re

    from specdec_plugin.adaptive.cost_model import CostTable

    with open(result_path) as f:
        log = json.load(f)["engines"][engine].get("controller_log", [])
    for line in log:
        m = re.search(r"step costs measured .*?target ((?:\d+:[\d.]+ ?)+)", line)
        if m:
            points = [pair.split(":") for pair in m.group(1).split()]
            return CostTable(tuple(int(c) for c, _ in points),
                             tuple(float(ms) * 1e-3 for _, ms in points), source="measured")
    raise ValueError(f"{result_path}: engine {engine!r} logged no measured step costs")


def generate_traces(max_tokens: int) -> dict:
    """Greedy answers to the real workloads' prompts, through our plugin on this machine."""
    from vllm import LLM, SamplingParams

    sys.path.insert(0, HERE)
    from real_workloads import WORKLOADS
    from specdec_plugin.models import fetch_smollm2

    llm = LLM(model=str(fetch_smollm2()), dtype="float32", max_model_len=MAX_MODEL_LEN,
              max_num_seqs=16, seed=0, enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    traces = {}
    for name, prompts in WORKLOADS.items():
        outputs = llm.generate(prompts, params, use_tqdm=False)
        traces[name] = [{"prompt": list(o.prompt_token_ids), "output": list(o.outputs[0].token_ids)}
                        for o in outputs]
    return traces


def _policies(table, base: str | None = None):
    """Name -> None (plain), "static" (K every step) or a factory of a fresh controller.
    ``base``: also the default controller as it is at that git revision (its modules loaded
    by bench_controller_host.load_old), to replay a change against what it replaces."""
    from specdec_plugin.adaptive.controller import DraftLengthController

    def adaptive(**settings):
        return lambda: DraftLengthController(K, table, learn_costs=False, **settings)

    policies = {
        "plain": None,
        "static": "static",
        "adaptive (default)": adaptive(),
        "adaptive, resume gain 0": adaptive(resume_gain=0.0),
        "adaptive, protect 0.25": adaptive(protect_quantile=0.25),
    }
    if base:
        from bench_controller_host import load_old

        old = load_old(base)
        old_table = old["cost_model"].CostTable(table.token_counts, table.target_s)
        policies[f"adaptive at {base}"] = lambda: old["controller"].DraftLengthController(
            K, old_table, learn_costs=False)
    return policies


def replay_cell(traces: list[dict], batch: int, policy, table, max_tokens: int,
                cell_prompts: int) -> dict:
    """One timed run of a cell as ``bench_gpu_side_by_side.py --cell-prompts`` runs it: the
    first ``cell_prompts`` prompts in rounds of ``batch`` requests (one closed batch each);
    0 or a batch at least that large: one closed batch of ``batch``."""
    if not cell_prompts or batch >= cell_prompts:
        return replay(traces, batch, policy, table, max_tokens)
    prompts = traces[:cell_prompts]
    chunks = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
    rounds = [replay(chunk, len(chunk), policy, table, max_tokens) for chunk in chunks]
    total = {key: sum(r[key] for r in rounds) for key in ("steps", "drafts", "drafted",
                                                          "accepted")}
    by_length = Counter()
    for r in rounds:
        by_length.update(r["steps_by_length"])
    return {"ms_per_token": sum(r["ms_per_token"] for r in rounds) / len(rounds), **total,
            "acceptance_length": (1.0 + total["accepted"] / total["drafts"]
                                  if total["drafts"] else None),
            "steps_by_length": dict(sorted(by_length.items()))}


def replay(traces: list[dict], batch: int, policy, table, max_tokens: int) -> dict:
    """One closed batch. ``policy``: None (plain steps), "static" (K every step) or a
    ``DraftLengthController``, whose state the caller keeps from run to run (an engine)."""
    from specdec_plugin.ops.ngram_match.reference import ngram_match

    requests = [traces[i % len(traces)] for i in range(batch)]
    ids = [f"r{i}" for i in range(batch)]
    histories = [list(r["prompt"]) for r in requests]
    done = [0] * batch  # tokens generated so far
    controller = policy if policy not in (None, "static") else None
    seconds, steps, request_drafts, drafted, accepted, chosen = 0.0, 0, 0, 0, 0, []
    while True:
        active = [i for i in range(batch) if done[i] < max_tokens]
        if not active:
            break
        if controller is not None:
            k = controller.choose([ids[i] for i in active])
        else:
            k = K if policy == "static" else 0
        chosen.append(k)
        seconds += table.step_time(len(active), k)
        steps += 1
        if k:
            width = max(len(histories[i]) for i in active)
            tokens = torch.zeros((len(active), width), dtype=torch.int32)
            for row, i in enumerate(active):
                tokens[row, :len(histories[i])] = torch.tensor(histories[i], dtype=torch.int32)
            num = torch.tensor([len(histories[i]) for i in active], dtype=torch.int32)
            drafts, counts = ngram_match(tokens, num, None, MIN_N, MAX_N, k, MAX_MODEL_LEN)
        for row, i in enumerate(active):
            truth = requests[i]["output"][done[i]:]
            m = 0
            if k:
                draft = drafts[row].tolist()
                filler = histories[i][-1]
                draft = [d if j < int(counts[row]) else filler for j, d in enumerate(draft)]
                while m < k and m < len(truth) - 1 and draft[m] == truth[m]:
                    m += 1
                request_drafts += 1
                drafted += k
                accepted += m
                if controller is not None:
                    controller.observe(ids[i], k, m)
            new = truth[:m + 1]
            histories[i].extend(new)
            done[i] += len(new)
            if done[i] >= max_tokens and controller is not None:
                controller.forget(ids[i])
    return {"ms_per_token": 1e3 * seconds / max_tokens, "steps": steps, "drafts": request_drafts,
            "drafted": drafted, "accepted": accepted,
            "acceptance_length": 1.0 + accepted / request_drafts if request_drafts else None,
            "steps_by_length": {str(k): chosen.count(k) for k in sorted(set(chosen))}}


def main():
    from specdec_plugin.adaptive.cost_model import CostTable

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--traces", help="JSON from an earlier run (default: generate them here)")
    p.add_argument("--save-traces", help="write the generated traces here")
    p.add_argument("--batches", default="1,4,16,64")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--workloads", help="comma list (default: all, prose first, as the GPU bench)")
    p.add_argument("--warmups", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", help="write the results as JSON")
    p.add_argument("--base", help="also replay the default controller at this git revision")
    p.add_argument("--cell-prompts", type=int, default=0,
                   help="time each batch below this many prompts over them, in rounds, as "
                        "the GPU bench's --cell-prompts (default 0: one closed batch)")
    p.add_argument("--cost-from", nargs=2, metavar=("RESULT_JSON", "ENGINE"),
                   help="use the table an engine measured at start instead of the model, e.g. "
                        "side_by_side.json ngram/ours (needs its controller_log)")
    args = p.parse_args()
    if args.traces:
        with open(args.traces) as f:
            traces = json.load(f)
    else:
        traces = generate_traces(args.max_tokens)
        if args.save_traces:
            with open(args.save_traces, "w") as f:
                json.dump(traces, f)
    if args.cost_from:
        table = measured_table(*args.cost_from)
        source = f"measured at engine start: {args.cost_from[1]} in {args.cost_from[0]}"
    else:
        table = CostTable(*zip(*H100_PADDED_7B))
        source = "modelled step costs (see replay_controller.py)"
    results = {"model": source, "cost_table": list(zip(table.token_counts, table.target_s)),
               "k": K, "max_tokens": args.max_tokens, "rows": []}
    print(f"{'workload':10}{'batch':>6}  {'policy':26}{'ms/tok':>8}{'vs plain':>9}"
          f"{'steps':>7}{'AL':>6}  steps by length (last timed run)")
    workloads = args.workloads.split(",") if args.workloads else list(traces)
    cells = [(w, int(b)) for w in workloads for b in args.batches.split(",")]
    by_cell = {}
    for name, policy in _policies(table, args.base).items():
        # One engine per policy, as the GPU bench runs one: the controller's state carries
        # over from cell to cell and from the warm-up to the timed runs.
        engine = policy() if callable(policy) else policy
        for workload, batch in cells:
            runs = [replay_cell(traces[workload], batch, engine, table, args.max_tokens,
                                args.cell_prompts)
                    for _ in range(args.warmups + args.repeats)][args.warmups:]
            r = dict(runs[-1], ms_per_token=float(np.median([x["ms_per_token"] for x in runs])),
                     ms_per_token_runs=[x["ms_per_token"] for x in runs])
            by_cell.setdefault((workload, batch), {})[name] = r
    for workload, batch in cells:
        plain = by_cell[(workload, batch)]["plain"]["ms_per_token"]
        for name, r in by_cell[(workload, batch)].items():
            r.update(workload=workload, batch=batch, policy=name,
                     vs_plain=r["ms_per_token"] / plain)
            results["rows"].append(r)
            drafting_steps = sum(v for k, v in r["steps_by_length"].items() if k != "0")
            print(f"{workload:10}{batch:>6}  {name:26}{r['ms_per_token']:8.2f}"
                  f"{r['vs_plain']:9.3f}{r['steps']:7d}{r['acceptance_length'] or 1.0:6.2f}  "
                  f"{r['steps_by_length']} ({drafting_steps} drafting)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
