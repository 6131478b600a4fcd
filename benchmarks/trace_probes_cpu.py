"""How often the adaptive controller probes in a real engine, batch 64, every draft rejected.

Why: issue 11's headline benchmark (bench_paired_plain.py, acceptance length 1.0) gives each
engine 64 fresh requests per run of 128 tokens. A probe verifies one draft token per request,
and at batch 64 on an H200 it costs about 2 ms over a 5.1 ms plain step, so the controller is
meant to probe such a run once. In session 44 the H200 engines drafted 3.0-3.7 probe tokens
per request per run; this script showed why on the CPU: the engine's first step holds only
part of the batch (a chunked prefill), and a probe's results come back a step late.

What: a tiny random Llama (gpu_models.py's "tiny-4l", ``load_format="dummy"``) with the
method's synthetic drafter at acceptance 1.0, in-process, ``--runs`` runs of 64 requests whose
prompts are shaped as the GPU benchmarks' (192 tokens, so a run's prefill spans two steps, as
it did there; bench_host_step_cpu.py's are 64 tokens); the
controller's ``choose`` is wrapped to record each step's batch size and chosen length. Prints,
per run, the steps that drafted (step index: batch size), and with
``SPECDEC_ADAPTIVE_PROBE_COST=observed`` what the probes were measured to cost.

    python benchmarks/trace_probes_cpu.py [--method eagle] [--runs 4]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the scheduler in this process
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo

from gpu_models import (  # noqa: E402  (benchmarks/ is this script's folder)
    FAMILIES,
    repeated_random_prompt,
    synthetic_spec_configs,
    tiny_cpu_engine,
    write_configs,
)

from specdec_plugin.adaptive.controller import DraftLengthController  # noqa: E402

FAMILY = "tiny-4l"


def record_choices(steps: list, controllers: list) -> None:
    choose = DraftLengthController.choose

    def recorded(self, req_ids):
        k = choose(self, req_ids)
        steps.append((len(req_ids), k))
        if not controllers:
            controllers.append(self)
        return k

    DraftLengthController.choose = recorded


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--method", default="eagle",
                   choices=["eagle", "eagle3", "draft_model", "ngram", "suffix"])
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=128)
    args = p.parse_args()

    steps: list[tuple[int, int]] = []
    controllers: list[DraftLengthController] = []
    record_choices(steps, controllers)
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    models = tempfile.TemporaryDirectory(prefix="trace_probes_")  # removed at exit
    paths = write_configs(models.name, FAMILY)
    spec = synthetic_spec_configs(paths, 1.0, 4)[args.method]
    llm = tiny_cpu_engine(paths["target"], spec, args.batch)
    vocab = FAMILIES[FAMILY]["target"]["vocab_size"]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    total = 0
    for run in range(args.runs):
        prompts = [TokensPrompt(prompt_token_ids=repeated_random_prompt(vocab=vocab,
                                                                        seed=run * 1000 + i))
                   for i in range(args.batch)]
        start = len(steps)
        llm.generate(prompts, params, use_tqdm=False)
        drafted = [f"{i}: {n}" for i, (n, k) in enumerate(steps[start:]) if k]
        total += len(drafted)
        print(f"run {run}: {len(steps) - start} steps, drafting steps (step: batch) "
              f"{', '.join(drafted) or 'none'}", flush=True)
    print(f"{args.method}: {total} drafting steps in {args.runs} runs of batch {args.batch}")
    probe_cost = controllers[0].probe_cost if controllers else None
    if probe_cost is not None:  # SPECDEC_ADAPTIVE_PROBE_COST=observed
        extra = probe_cost.extra_steps(args.batch)
        print(f"a probe's measured extra time at batch {args.batch}: "
              f"{'not measured' if extra is None else f'{extra:.2f} plain steps'}")


if __name__ == "__main__":
    main()
