"""Linear layers of SmolLM2-135M on the CPU: which implementation is fastest at decode sizes.

One process, every variant interleaved in each repeat (the machine may be shared: comparing
runs taken minutes apart would measure the neighbours), median of the repeats. Each timing
cycles through as many distinct weight matrices of a shape as the model has (30 per layer
shape), so weights come from memory as in a decode step: with one matrix called again and
again, the small ones stay in the L2/L3 caches and our GEMV looked 1.5-2x faster than oneDNN,
while in the engine it was 1.4x slower. Per shape and
M (tokens in the step): ms per call, and for the whole model (30 layers x 4 GEMMs + LM head)
the ms per step it implies.

    python benchmarks/bench_cpu_linear.py [--threads 2] [--repeats 30] [--json out.json]

Variants: torch F.linear fp32 (what vLLM does), oneDNN prepacked (fp32; bf16 weights with the
activations cast to bf16; ops/linear/onednn.py), MKL packed fp32, and ours (ops/linear/cpp.py,
csrc/cpu_linear_packed.cpp): bf16 weight panels widened to fp32 in registers (``cpp_bf16w``,
the float32 product on these bf16-exact weights) and the same kernel on fp32 panels
(``cpp_fp32``), and the bf16 panels through the kernel's element-at-a-time path
(``cpp_bf16w_portable``: a CPU with neither AVX-512 nor AVX2 runs it). An earlier AVX-512 GEMV of ours (csrc/cpu_linear.cpp, commit 4825ceb, removed)
lost to oneDNN once the weights came from memory (BENCHMARKS.md). Weights are fresh random per
shape, rounded to bf16 values (as a bf16 checkpoint loaded in fp32); every variant is checked
against fp32 F.linear. OpenMP threads wait passively, as in the engine (device/cpu.py).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP

import torch
import torch.nn.functional as F

from specdec_plugin.ops.linear import cpp

# (name, out_features N, in_features K, how many per model step)
SHAPES = [("qkv", 960, 576, 30), ("o", 576, 576, 30), ("gate_up", 3072, 576, 30),
          ("down", 576, 1536, 30), ("lm_head", 49152, 576, 1)]
MS = (1, 4, 8, 32)
_SKIPPED: set = set()  # variants this machine cannot run, reported once


def variants(w: torch.Tensor, m: int) -> dict:
    """Callables ``f(x)`` for one weight ``w`` (each variant packs its own copy)."""
    out = {"torch_fp32": lambda x: F.linear(x, w)}
    try:
        wd = torch.ops.mkldnn._reorder_linear_weight(w)
        out["onednn_fp32"] = lambda x: torch.ops.mkldnn._linear_pointwise(x, wd, None, "none", [], "")
    except RuntimeError as e:  # a torch without oneDNN linear
        print("oneDNN skipped:", e)
    try:  # apart: oneDNN refuses bfloat16 on CPUs without avx512bw/vl/dq or avx_ne_convert
        wdb = torch.ops.mkldnn._reorder_linear_weight(w.bfloat16())
        out["onednn_bf16"] = lambda x: torch.ops.mkldnn._linear_pointwise(
            x.bfloat16(), wdb, None, "none", [], "").float()
    except RuntimeError as e:
        if not _SKIPPED:
            print("oneDNN bf16 skipped:", str(e).splitlines()[0])
        _SKIPPED.add("onednn_bf16")
    if cpp.available():  # ours: bf16 (or fp32) panels widened to fp32 in registers
        packs = {dt: cpp.pack_linear_weight(w, dt) for dt in (torch.bfloat16, torch.float32)}
        for dt, vname in ((torch.bfloat16, "cpp_bf16w"), (torch.float32, "cpp_fp32")):
            out[vname] = lambda x, pw=packs[dt]: cpp.linear(x, pw)
        # The same bf16 panels through the element-at-a-time path: what CPUs without AVX-512
        # ran before the AVX2 tiles (session 30), and the bits every vectorized path must match.
        ext = cpp._ext()
        out["cpp_bf16w_portable"] = lambda x, pw=packs[torch.bfloat16]: ext.cpu_linear_packed(
            x, pw.weight, pw.out_features, None, True)
    else:
        print("cpp skipped: specdec_plugin._C has no cpu_linear_packed (rebuild the extension)")
    try:
        wk = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
        out["mkl_packed_fp32"] = lambda x: torch.ops.mkl._mkl_linear(x, wk, w, None, m)
    except RuntimeError as e:
        print("MKL packed skipped:", e)

    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--variants", default=None,
                    help="comma list of variants to time (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    with open("/proc/loadavg") as f:
        load_before = f.read().strip()
    results: dict = {}
    for name, n, k, count in SHAPES:
        # bfloat16-exact values, as a bfloat16 checkpoint loaded in float32 has (cpp_bf16w is
        # then the float32 product)
        ws = [(torch.randn(n, k, generator=g) * k ** -0.5).bfloat16().float()
              for _ in range(count)]
        for m in MS:
            x = torch.randn(m, k, generator=g)
            per_w = [variants(w, m) for w in ws]
            if args.variants:
                keep = set(args.variants.split(","))
                per_w = [{v: f for v, f in vs.items() if v in keep} for vs in per_w]
            names = list(per_w[0])
            want = F.linear(x, ws[0])
            for vname, f in per_w[0].items():  # correctness
                err = (f(x) - want).abs().max().item()
                tol = 5e-2 if vname == "onednn_bf16" else 1e-3
                assert err < tol, (name, m, vname, err)
            times = {v: [] for v in names}
            for _ in range(args.repeats):
                for vname in names:
                    fs = [vs[vname] for vs in per_w]
                    t0 = time.perf_counter()
                    for f in fs:
                        f(x)
                    times[vname].append((time.perf_counter() - t0) / len(fs) * 1e3)
            del per_w
            med = {v: statistics.median(t) for v, t in times.items()}
            results[f"{name}/M={m}"] = {"N": n, "K": k, "count": count, "ms": med}
            print(f"{name:8s} M={m:<3d} " + "  ".join(f"{v}={t:.4f}" for v, t in med.items()),
                  flush=True)
    with open("/proc/loadavg") as f:
        load_after = f.read().strip()
    print(f"\nms per model step (30 x (qkv + o + gate_up + down) + lm_head); load before "
          f"{load_before}, after {load_after}")
    step: dict = {}
    for m in MS:
        tot: dict = {}
        for name, _n, _k, count in SHAPES:
            for v, t in results[f"{name}/M={m}"]["ms"].items():
                tot[v] = tot.get(v, 0.0) + t * count
        step[m] = tot
        print(f"M={m:<3d} " + "  ".join(f"{v}={t:.1f}" for v, t in tot.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "repeats": args.repeats,
                       "load_before": load_before, "load_after": load_after,
                       "per_shape": results, "per_step_ms": step}, f, indent=1)


if __name__ == "__main__":
    main()
