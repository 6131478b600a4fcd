"""Host time of the adaptive draft-length controller per engine step, before and after.

Why: the controller runs on the host every engine step (specdec_plugin/adaptive/): vLLM's
scheduler reports each request's verification result (``observe``, once per request) and then
asks for the next draft length (``choose``). An H100 profile at batch 64 showed the speculative
pipeline nearly host-bound, and these calls were ~0.5 ms of it per step on the CPU.

What: per step, ``observe(req, k, accepted)`` for each of N requests (k: the length chosen
the step before; accepted: each position accepted with probability --accept, the same stream
for both), with --learn-costs the step's time (``observe_step_time``), then ``choose(reqs)``;
N in --batch (1, 16, 64, 256). Until session 41 every step observed one draft per request. "old" is the
controller as it is at --base (its acceptance, policy, cost table, observed-cost and controller
modules loaded from ``git show``), "new" the working tree's. The two are timed in alternating
blocks of --steps steps (which goes first alternates too), --repeats blocks each; the median
block gives us/step. Both see the same stream and must choose the same length every step.

    PYTHONPATH=. python benchmarks/bench_controller_host.py [--base main] [--batch 64] \
        [--accept 0 --learn-costs]
"""
from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np

import specdec_plugin.adaptive.controller as new_controller
import specdec_plugin.adaptive.cost_model as new_cost_model

REPO = Path(__file__).resolve().parent.parent
# In import order: each module sees the old versions of those before it.
MODULES = ("cost_model", "acceptance", "policy", "observed_cost", "controller")
K = 4
TOKEN_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 320)


def load_old(base: str) -> dict[str, types.ModuleType]:
    """The controller's modules as they are at ``base``: executed under their own names with
    sys.modules pointing at each other, so that the old controller imports the old tracker,
    then sys.modules restored."""
    package = "specdec_plugin.adaptive"
    saved = {name: sys.modules.get(f"{package}.{name}") for name in MODULES}
    loaded = {}
    try:
        for name in MODULES:
            path = f"specdec_plugin/adaptive/{name}.py"
            source = subprocess.run(["git", "show", f"{base}:{path}"], cwd=REPO, check=True,
                                    capture_output=True, text=True).stdout
            module = types.ModuleType(f"{package}.{name}")
            module.__file__ = f"{base}:{path}"
            sys.modules[module.__name__] = module  # dataclasses look their module up here
            exec(compile(source, module.__file__, "exec"), module.__dict__)
            loaded[name] = module
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(f"{package}.{name}", None)
            else:
                sys.modules[f"{package}.{name}"] = module
    return loaded


def make_controller(controller_module, cost_model_module, learn_costs: bool):
    table = cost_model_module.CostTable(TOKEN_COUNTS, tuple(0.006 + 0.00001 * c
                                                            for c in TOKEN_COUNTS))
    return controller_module.DraftLengthController(K, table, learn_costs=learn_costs)


def run_block(controller, reqs, accepted_rows, times, chosen, noise):
    """Steps of observe x N (and, with observed step costs, the step's time: the table's
    times ``noise``) + choose; appends (observe s, choose s) per step."""
    observe, choose = controller.observe, controller.choose
    learn = controller.observed_cost is not None
    clock = time.perf_counter
    k = chosen[-1] if chosen else K
    for accepted, factor in zip(accepted_rows, noise):
        t0 = clock()
        for req, acc in zip(reqs, accepted):
            observe(req, k, min(acc, k))
        if learn:
            controller.observe_step_time(len(reqs), k,
                                         controller.table.step_time(len(reqs), k) * factor)
        t1 = clock()
        k = choose(reqs)
        chosen.append(k)
        times.append((t1 - t0, clock() - t1))


def bench(n: int, old_modules, steps: int, repeats: int, seed: int, accept: float,
          learn_costs: bool):
    rng = np.random.default_rng(seed)
    reqs = [f"req-{i}" for i in range(n)]
    impls = {
        "old": make_controller(old_modules["controller"], old_modules["cost_model"],
                               learn_costs),
        "new": make_controller(new_controller, new_cost_model, learn_costs),
    }
    per_block = {name: [] for name in impls}  # (observe us/step, choose us/step) per block
    chosen = {name: [] for name in impls}
    # One unmeasured block each first: the first steps allocate (rows, remembered step times).
    warm = (rng.random((steps, n)) < accept).astype(int).tolist()
    noise = rng.uniform(0.9, 1.3, steps).tolist()
    for name, controller in impls.items():
        run_block(controller, reqs, warm, [], chosen[name], noise)
    for rep in range(repeats):
        # accepted drafts per request: 0..K, each position accepted with probability --accept
        accepted = (rng.random((steps, n, K)) < accept).cumprod(axis=2).sum(axis=2).tolist()
        noise = rng.uniform(0.9, 1.3, steps).tolist()
        order = list(impls) if rep % 2 == 0 else list(reversed(impls))
        for name in order:
            times = []
            run_block(impls[name], reqs, accepted, times, chosen[name], noise)
            obs = sum(t[0] for t in times) / steps * 1e6
            cho = sum(t[1] for t in times) / steps * 1e6
            per_block[name].append((obs, cho))
    if chosen["old"] != chosen["new"]:
        step = next(i for i, (a, b) in enumerate(zip(chosen["old"], chosen["new"])) if a != b)
        raise AssertionError(f"batch {n}: old and new chose differently at step {step}")
    result = {}
    for name, blocks in per_block.items():
        totals = [o + c for o, c in blocks]
        result[name] = (statistics.median(totals),
                        statistics.median(o for o, _ in blocks),
                        statistics.median(c for _, c in blocks))
    return result, statistics.Counter(chosen["new"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="main", help="git revision of the 'old' controller")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--steps", type=int, default=200, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=15, help="timed blocks per version")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--accept", type=float, default=0.5,
                        help="probability that each draft position is accepted (0: drafting "
                             "turns off, the controller takes plain steps and probes)")
    parser.add_argument("--learn-costs", action="store_true",
                        help="observed step costs on (SPECDEC_ADAPTIVE_OBSERVED_COST), each "
                             "step's time the table's times a factor in 0.9-1.3")
    args = parser.parse_args()
    logging.disable(logging.INFO)  # the controller logs when it turns drafting on or off
    base = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout.strip()
    old_modules = load_old(args.base)
    print(f"old: {args.base} ({base}); new: working tree; K={K}; {args.steps} steps x "
          f"{args.repeats} blocks each, median block; us per step")
    print(f"{'batch':>5} | {'old total':>9} {'observe':>8} {'choose':>8} | "
          f"{'new total':>9} {'observe':>8} {'choose':>8} | {'old/new':>7} | lengths chosen")
    for n in args.batch:
        result, lengths = bench(n, old_modules, args.steps, args.repeats, args.seed + n,
                                args.accept, args.learn_costs)
        old, new = result["old"], result["new"]
        print(f"{n:>5} | {old[0]:>9.1f} {old[1]:>8.1f} {old[2]:>8.1f} | "
              f"{new[0]:>9.1f} {new[1]:>8.1f} {new[2]:>8.1f} | {old[0] / new[0]:>6.2f}x | "
              f"{dict(sorted(lengths.items()))}", flush=True)


if __name__ == "__main__":
    main()
