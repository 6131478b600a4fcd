"""Split-KV slices as the engine plans them: our paged attention on a CUDA device, planned for
``--plan-seq-len`` (the engine passes max_model_len) over contexts far shorter than that, at
several slice minimums (``split_min_keys``), beside a baseline kernel file given with
``--baseline`` (e.g. the kernel before a change, ``git show REV:specdec_plugin/ops/paged_attention/triton.py``)
and vLLM's FlashAttention where vLLM is installed (what vLLM's own CUDA backend runs).

    python benchmarks/bench_attention_splits.py --baseline /tmp/old_triton.py --out F.json

The heads are the side-by-side benchmark's 7.24B Llama (32 query / 8 KV heads of 128, bf16,
blocks of 16). Each time is the median of ``triton.testing.do_bench_cudagraph`` (device time
of a captured launch, as decode and verification run in the engine), in microseconds, with
every variant's output compared against ours at the default minimum first.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_attention_kernels import (  # noqa: E402  (same inputs and FlashAttention call)
    flash_attention,
    make_inputs,
)

from specdec_plugin.ops.paged_attention import triton as ours  # noqa: E402

HQ, HKV, HEAD, BLOCK = 32, 8, 128, 16


def _load_file(path: str):
    spec = importlib.util.spec_from_file_location("baseline_paged_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ours(x, plan_seq_len, split_min_keys):
    out = torch.empty_like(x["q"])

    def run():
        ours.paged_attention_splits(x["q"], x["k_cache"], x["v_cache"], x["block_table"],
                                    x["cu_q"], x["seq_lens"], x["scale"], out, x["q_len"],
                                    x["seq_len"], None, plan_seq_len=plan_seq_len,
                                    split_min_keys=split_min_keys)
    return run, out


def _baseline(module, x, plan_seq_len):
    out = torch.empty_like(x["q"])

    def run():
        module.paged_attention(x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["cu_q"],
                               x["seq_lens"], x["scale"], out, x["q_len"], x["seq_len"],
                               plan_seq_len=plan_seq_len)
    return run, out


def _time(run):
    run()  # compiles, and allocates the split workspace before any capture
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(run, rep=100, return_mode="median") * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", help="a paged-attention kernel file to time beside ours")
    p.add_argument("--plan-seq-len", type=int, default=1024)
    p.add_argument("--min-keys", default="64,128,256,512", help="split_min_keys values")
    p.add_argument("--batches", default="1,4,16,64")
    p.add_argument("--contexts", default="150,600,2000")
    p.add_argument("--spec", type=int, default=4, help="verification rows: 1 + spec")
    p.add_argument("--merge-warps", default="", help="comma list: time ours with each merge "
                   "num_warps too (columns 'min K/wW')")
    p.add_argument("--out", help="JSON file for the rows")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA device")
    baseline = _load_file(args.baseline) if args.baseline else None
    try:
        from vllm.vllm_flash_attn import flash_attn_varlen_func  # noqa: F401
        flash = True
    except Exception as exc:  # vLLM not installed here: report and go on
        print(f"  no flash-attn column: {type(exc).__name__}: {str(exc)[:100]}")
        flash = False
    variants = [(int(k), None) for k in args.min_keys.split(",")]
    variants += [(int(k), int(w)) for w in args.merge_warps.split(",") if w
                 for k in args.min_keys.split(",")]
    default_warps = ours._MERGE_NUM_WARPS
    print(f"{torch.cuda.get_device_name()}  heads {HQ}/{HKV}x{HEAD} bf16  plan_seq_len "
          f"{args.plan_seq_len}  (us, device time of a captured launch, median)")
    head = f"{'q':>3}{'batch':>6}{'ctx':>6}"
    head += f"{'baseline':>10}" if baseline else ""
    head += f"{'flash':>8}" if flash else ""
    names = [f"min {k}" + (f"/w{w}" if w else "") for k, w in variants]
    head += "".join(f"{n:>10}" for n in names) + f"{'maxdiff':>9}"
    print(head)
    rows = []
    for q_len in (1, 1 + args.spec):
        for batch in (int(b) for b in args.batches.split(",")):
            for ctx in (int(c) for c in args.contexts.split(",")):
                x = make_inputs(batch, q_len, ctx, HQ, HKV, HEAD, BLOCK, torch.bfloat16)
                row = {"q_len": q_len, "batch": batch, "ctx": ctx, "ours_us": {}}
                runs = {n: _ours(x, args.plan_seq_len, k) for n, (k, _) in zip(names, variants)}
                runs[names[0]][0]()
                reference = runs[names[0]][1].float().clone()
                diff = 0.0
                if baseline:
                    run, out = _baseline(baseline, x, args.plan_seq_len)
                    row["baseline_us"] = _time(run)
                    diff = max(diff, (out.float() - reference).abs().max().item())
                if flash:
                    run, out = flash_attention(x)
                    row["flash_us"] = _time(run)
                    diff = max(diff, (out.float() - reference).abs().max().item())
                for (n, (run, out)), (_, warps) in zip(runs.items(), variants):
                    ours._MERGE_NUM_WARPS = warps or default_warps
                    row["ours_us"][n] = _time(run)
                    diff = max(diff, (out.float() - reference).abs().max().item())
                ours._MERGE_NUM_WARPS = default_warps
                row["maxdiff"] = diff
                rows.append(row)
                line = f"{q_len:>3}{batch:>6}{ctx:>6}"
                line += f"{row['baseline_us']:>10.1f}" if baseline else ""
                line += f"{row['flash_us']:>8.1f}" if flash else ""
                line += "".join(f"{row['ours_us'][n]:>10.1f}" for n in names)
                print(line + f"{diff:>9.1e}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "plan_seq_len": args.plan_seq_len,
                       "heads": [HQ, HKV, HEAD], "block_size": BLOCK, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
