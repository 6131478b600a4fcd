"""Acceptance of trained drafters through our plugin, on the held-out prompts, per category.

    python -m training.eval_acceptance --drafters DIR --out FILE.json [--methods ...] [--k 4]

DIR is a training run's output (``<kind>.safetensors``) or an assets tree
(``<kind>/model.safetensors``, e.g. ``specdec_plugin/assets/drafters``, the default). The
drafters are turned into vLLM checkpoints by ``specdec_plugin.models.drafters`` (the code that
serves the shipped ones) in a cache of their own, and each method runs in a fresh process with
the real vLLM engine on our platform: greedy, fixed K (adaptive drafting off), ``--max-tokens``
per prompt, the prompts of ``heldout_eval_prompts.json`` one category at a time. From vLLM's
speculative-decoding counters it reports, per method and category: drafts, accepted tokens per
draft position, and the acceptance length 1 + accepted / drafts (tokens per target step).
MTP drafts ``--mtp-k`` tokens (1: the MTP layer is trained for one). CPU: float32; GPU: bf16.

For EAGLE-3 it also reports ``draft_vocab_coverage``: the share of the generated tokens that
its draft vocabulary holds. A token outside it can never be drafted, so its position is always
rejected. Why: chat was EAGLE-3's weakest category (issue 17), and a smaller vocabulary is a
cause that more training would not remove.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from training.eval_prompts import PATH as DEFAULT_PROMPTS

KINDS = ("eagle3", "eagle", "draft_model", "mtp")
_COUNTERS = {"vllm:spec_decode_num_drafts": "drafts",
             "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--drafters", type=Path, help="run output or assets tree (default: shipped)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--methods", default=",".join(KINDS))
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--mtp-k", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--per-category", type=int, default=24)
    p.add_argument("--categories", default="", help="comma list; default all in the prompt file")
    p.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    p.add_argument("--dtype", default="auto", help="auto: bfloat16 on a GPU, float32 on CPU")
    p.add_argument("--parallel", type=int, default=0, help="engines at once (0: 4 on GPU, 1 CPU)")
    p.add_argument("--work", type=Path, help="checkpoints are built here (default: a temp dir)")
    p.add_argument("--timeout-s", type=float, default=1200)
    p.add_argument("--eager", action="store_true",
                   help="no torch.compile / graphs: engines start much faster; graph replay "
                        "equals eager in fp32 (GPU tests), bf16 may round differently")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: one method's job, as JSON
    return p.parse_args(argv)


def assets_tree(drafters: Path | None, work: Path) -> Path | None:
    """An assets-layout directory for ``drafters`` (None: the shipped assets)."""
    if drafters is None or any((drafters / k).is_dir() for k in KINDS):
        return drafters
    from training.unpack_device_output import unpack

    tree = work / "assets"
    unpack(drafters, tree)
    return tree


def counters(llm) -> dict:
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_position": []}
    for metric in llm.get_metrics():
        if metric.name in _COUNTERS:
            out[_COUNTERS[metric.name]] += int(metric.value)
        elif metric.name == _PER_POS:
            vals = [int(v) for v in metric.values]
            base = out["per_position"] + [0] * (len(vals) - len(out["per_position"]))
            out["per_position"] = [a + b for a, b in zip(base, vals + [0] * len(base))]
    return out


def summarize(before: dict, after: dict, generated: int, wall: float, n: int) -> dict:
    d = {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}
    per_pos = [a - (before["per_position"][i] if i < len(before["per_position"]) else 0)
               for i, a in enumerate(after["per_position"])]
    d.update(prompts=n, generated_tokens=generated, wall_s=round(wall, 2), accepted_per_position=per_pos)
    if d["drafts"]:
        d["acceptance_length"] = round(1 + d["accepted"] / d["drafts"], 4)
        d["acceptance_per_position"] = [round(a / d["drafts"], 4) for a in per_pos]
    return d


def draft_vocab_mask(spec: dict):
    """EAGLE-3's ``t2d`` (target id -> whether the draft vocabulary holds it) from the drafter's
    checkpoint, or None for drafters without a draft vocabulary."""
    from safetensors import safe_open

    for path in sorted(Path(spec["model"]).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            if "t2d" in f.keys():
                return f.get_tensor("t2d").bool()
    return None


def vocab_coverage(mask, token_ids: list[list[int]]) -> float | None:
    """The share of ``token_ids`` (one list per output) inside ``mask``'s vocabulary."""
    flat = [t for ids in token_ids for t in ids]
    if mask is None or not flat:
        return None
    return round(sum(bool(mask[t]) for t in flat) / len(flat), 4)


def run_one(job: dict) -> dict:
    """One method in this process: an engine, then every category's prompts."""
    os.environ["SPECDEC_ADAPTIVE"] = "0"  # fixed K: the acceptance at K is what is measured
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    t0 = time.time()
    llm = LLM(model=job["target"], speculative_config=job["spec"], seed=0,
              disable_log_stats=False, enable_prefix_caching=False, **job["engine"])
    result = {"platform": type(current_platform).__name__,
              "engine_start_s": round(time.time() - t0, 1), "categories": {}}
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"])
    mask = draft_vocab_mask(job["spec"]) if job["spec"].get("method") == "eagle3" else None
    total_before, generated_all, wall_all, n_all = counters(llm), 0, 0.0, 0
    outputs_all = []
    for cat, prompts in job["prompts"].items():
        before = counters(llm)
        t = time.time()
        outs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
        wall = time.time() - t
        outputs = [list(o.outputs[0].token_ids) for o in outs]
        generated = sum(len(ids) for ids in outputs)
        result["categories"][cat] = summarize(before, counters(llm), generated, wall, len(prompts))
        generated_all, wall_all, n_all = generated_all + generated, wall_all + wall, n_all + len(prompts)
        outputs_all += outputs
        if mask is not None:
            result["categories"][cat]["draft_vocab_coverage"] = vocab_coverage(mask, outputs)
    result["all"] = summarize(total_before, counters(llm), generated_all, wall_all, n_all)
    if mask is not None:
        result["all"]["draft_vocab_coverage"] = vocab_coverage(mask, outputs_all)
    return result


def run_subprocess(job: dict, timeout_s: float) -> dict:
    from specdec_plugin.engine_ports import engine_port_env

    cmd = [sys.executable, "-m", "training.eval_acceptance", "--out", "-", "--one", json.dumps(job)]
    # Engines started at once must not be handed the same rendezvous port (engine_ports.py).
    env = {**os.environ, **engine_port_env()}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env,
                              cwd=str(Path(__file__).resolve().parent.parent))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f}s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-3000:]}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(run_one(json.loads(args.one))), flush=True)
        return 0
    import torch

    from specdec_plugin.models import drafters as shipped

    t0 = time.time()
    cuda = torch.cuda.is_available()
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if cuda else "float32")
    work = args.work or Path(tempfile.mkdtemp(prefix="specdec_eval_"))
    work.mkdir(parents=True, exist_ok=True)
    tree = assets_tree(args.drafters, work)
    cache = work / "cache" if tree is not None else None
    prompts = json.loads(args.prompts.read_text())
    cats = [c for c in (args.categories.split(",") if args.categories else prompts) if c in prompts]
    prompts = {c: [p["prompt_token_ids"] for p in prompts[c][: args.per_category]] for c in cats}
    engine = {"dtype": dtype, "max_model_len": 2048, "enforce_eager": args.eager}
    if cuda:
        engine.update(gpu_memory_utilization=0.15, kv_cache_memory_bytes=2 << 30)
    jobs = {}
    for kind in args.methods.split(","):
        k = args.mtp_k if kind == "mtp" else args.k
        jobs[kind] = {"target": str(shipped.target_for(kind, cache, tree)),
                      "spec": shipped.speculative_config(kind, k, cache, tree),
                      "engine": engine, "max_tokens": args.max_tokens, "prompts": prompts}
    parallel = args.parallel or (4 if cuda else 1)
    with ThreadPoolExecutor(parallel) as pool:
        futures = {k: pool.submit(run_subprocess, job, args.timeout_s) for k, job in jobs.items()}
        results = {k: f.result() for k, f in futures.items()}
    report = {"device": torch.cuda.get_device_name() if cuda else "cpu", "dtype": dtype,
              "k": args.k, "mtp_k": args.mtp_k, "max_tokens": args.max_tokens, "eager": args.eager,
              "drafters": str(args.drafters or "shipped assets"), "prompts_file": args.prompts.name,
              "prompts_per_category": {c: len(v) for c, v in prompts.items()},
              "total_s": round(time.time() - t0, 1), "methods": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    for kind, r in results.items():
        if "error" in r:
            print(f"{kind:12s} ERROR {r['error']} {r.get('stderr_tail', '')[-800:]}")
            continue
        by_cat = {c: v.get("acceptance_length") for c, v in r["categories"].items()}
        print(f"{kind:12s} acceptance {r['all'].get('acceptance_length')} "
              f"per position {r['all'].get('acceptance_per_position')} by category {by_cat}")
        coverage = {c: v["draft_vocab_coverage"] for c, v in r["categories"].items()
                    if "draft_vocab_coverage" in v}
        if coverage:
            print(f"{kind:12s} draft vocabulary coverage of the output by category {coverage}")
    print(f"wrote {args.out} in {report['total_s']}s")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
