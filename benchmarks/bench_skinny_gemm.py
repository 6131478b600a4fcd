"""Our skinny GEMM (ops/skinny_gemm) against cuBLAS (``F.linear``), side by side on one GPU.

The shapes are the linear layers of the random 7.24B Llama of bench_gpu_side_by_side.py
(Mistral-7B's: hidden 4096, 8 KV heads, MLP 14336, vocabulary 32000) in bfloat16, at the row
counts of a small-batch speculative step (1-16 tokens). Each product is timed as a speculative
step runs it: inside a CUDA graph, one product after another, each on a different copy of the
weight (at least 400 MB in all, so the 50-MB L2 cache never holds the next one), with device
events around 20 replays after 5 warm-up ones, median of 5 such timings. Bandwidth counts the
weight's bytes only. Row counts 17-64 run the op's 64-row tile (a batch-16 verification of 2
or 3 drafts multiplies 48 or 64 rows); P16 uses it only where ``wide_tile_pays`` (printed).

    python3 benchmarks/bench_skinny_gemm.py [--sweep] [--out DIR]

``--sweep`` first times every block config of ``CONFIGS`` at 3 rows and prints the best per
shape, then times that one at every row count beside the chosen one; without it only the
config that ``block_config`` chooses is timed. Prints, per shape
and row count, cuBLAS's and our time and ours / cuBLAS; writes ``skinny_gemm.json`` to
``--out`` after every shape (a call cut short keeps what was measured).

``--wide`` then sweeps ``WIDE_CONFIGS`` at ``WIDE_ROWS`` rows with a 64- or 128-row tile
(80 rows, a batch-16 verification of 4 drafts, is more than the op accepts), best against
cuBLAS: the probe the 64-row tile's configs came from (session 65).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdec_plugin.ops.skinny_gemm import reference, triton as ours  # noqa: E402
from specdec_plugin.ops.skinny_gemm.validate import NARROW_ROWS  # noqa: E402

SHAPES = {  # name: (out_features N, in_features K)
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "lm_head": (32000, 4096),
    "eagle3_fc": (4096, 12288),
}
ROWS = (1, 2, 3, 5, 8, 16, 17, 48, 64)
# (BLOCK_N, BLOCK_K, num_warps, num_stages, SPLIT_K): the one-pass grid, then K split in 2 or 4.
CONFIGS = [(bn, bk, w, s, 1) for bn, bk, (w, s) in itertools.product(
    (16, 32, 64), (128, 256, 512), ((4, 3), (4, 4), (8, 4), (4, 6)))] + [
    (bn, 256, 4, 4, split) for bn in (16, 32, 64) for split in (2, 4)]
WIDE_ROWS = (40, 80)
WIDE_CONFIGS = [(bn, bk, w, s, 1) for bn, bk, (w, s) in itertools.product(
    (32, 64, 128), (64, 128), ((4, 3), (4, 4), (8, 3)))]
MIN_BYTES = 400 * 2**20


def time_graph(fn, copies: int) -> float:
    """Seconds per product: ``fn(i)`` for each weight copy i, captured in one graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(copies):  # compile and warm up outside the capture
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(copies):
            fn(i)
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / (20 * copies))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--wide", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    print(f"# {torch.cuda.get_device_name(dev)}, {sms} SMs, torch {torch.__version__}")
    result = {"device": torch.cuda.get_device_name(dev), "dtype": "bfloat16", "shapes": {}}
    for name, (n, k) in SHAPES.items():
        nbytes = n * k * 2
        copies = max(2, -(-MIN_BYTES // nbytes))
        weights = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
                   for _ in range(copies)]
        entry = result["shapes"][name] = {"N": n, "K": k, "rows": {},
                                          "wide_tile_pays": ours.wide_tile_pays(n, sms)}
        chosen = ours.block_config(n, k, sms)
        print(f"{name}: 16-row tile {chosen}, 64-row tile {ours.wide_block_config(n, k, sms)}"
              f" (P16 uses it: {entry['wide_tile_pays']})")
        best = None
        if args.sweep:
            x = torch.randn(3, k, device=dev, dtype=torch.bfloat16)
            swept = sweep(name, x, weights, copies, CONFIGS, NARROW_ROWS)
            best = swept[0][1] if swept else None
            base = time_graph(lambda i: F.linear(x, weights[i]), copies)
            entry["sweep_3_rows"] = [{"config": list(c), "us": t * 1e6} for t, c in swept]
            print(f"{name} 3 rows: cuBLAS {base * 1e6:.1f} us; best " + ", ".join(
                f"{c} {t * 1e6:.1f}" for t, c in swept[:4]) + f"; chosen {chosen}")
        for m in ROWS:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            want = reference.skinny_gemm(x, weights[0])
            err = (ours.skinny_gemm(x, weights[0]).float() - want.float()).abs().max().item()
            t_blas = time_graph(lambda i: F.linear(x, weights[i]), copies)
            t_ours = time_graph(lambda i: ours.skinny_gemm(x, weights[i]), copies)
            entry["rows"][m] = {"cublas_us": t_blas * 1e6, "ours_us": t_ours * 1e6,
                                "ours_over_cublas": t_ours / t_blas, "max_abs_err": err,
                                "cublas_tb_s": nbytes / t_blas / 1e12,
                                "ours_tb_s": nbytes / t_ours / 1e12}
            if best is not None and best != chosen and m <= NARROW_ROWS:  # the 3-row winner
                t_best = time_graph(lambda i: ours.launch(x, weights[i], None, best), copies)
                entry["rows"][m].update(best_config=list(best), best_us=t_best * 1e6)
                print(f"{'':9s} best swept config {best}: {t_best * 1e6:7.1f} us, "
                      f"/cuBLAS {t_best / t_blas:.3f}")
            print(f"{name:9s} N={n:5d} K={k:5d} rows={m:2d}: cuBLAS {t_blas * 1e6:7.1f} us "
                  f"({nbytes / t_blas / 1e12:.2f} TB/s), ours {t_ours * 1e6:7.1f} us "
                  f"({nbytes / t_ours / 1e12:.2f} TB/s), ours/cuBLAS {t_ours / t_blas:.3f}, "
                  f"max err {err:.2e}")
        if args.wide:
            entry["wide"] = probe_wide(name, weights, copies)
        del weights
        torch.cuda.empty_cache()
        (out / "skinny_gemm.json").write_text(json.dumps(result, indent=1))


def sweep(label: str, x: torch.Tensor, weights: list[torch.Tensor], copies: int,
          configs: list, block_m: int) -> list[tuple[float, tuple]]:
    """``(seconds per product, config)`` for each of ``configs`` that runs, fastest first."""
    swept = []
    for cfg in configs:
        try:
            t = time_graph(lambda i: ours.launch(x, weights[i], None, cfg, block_m), copies)
        except Exception as exc:  # e.g. out of shared memory for a deep pipeline
            print(f"{label} {cfg}: {type(exc).__name__}")
            continue
        swept.append((t, cfg))
    return sorted(swept)


def probe_wide(name: str, weights: list[torch.Tensor], copies: int) -> dict:
    """cuBLAS against the best of ``WIDE_CONFIGS`` at each of ``WIDE_ROWS`` rows."""
    n, k = weights[0].shape
    found = {}
    for m in WIDE_ROWS:
        block_m = max(16, 1 << (m - 1).bit_length())
        x = torch.randn(m, k, device=weights[0].device, dtype=torch.bfloat16)
        swept = sweep(f"{name} wide {m}", x, weights, copies, WIDE_CONFIGS, block_m)
        t_blas = time_graph(lambda i: F.linear(x, weights[i]), copies)
        err = None
        if swept:
            got = ours.launch(x, weights[0], None, swept[0][1], block_m).float()
            # The reference's own formula: it refuses more than 64 rows, as the op does.
            err = (got - F.linear(x.float(), weights[0].float())).abs().max().item()
        found[m] = {"cublas_us": t_blas * 1e6, "block_m": block_m, "max_abs_err": err,
                    "best": [{"config": list(c), "us": t * 1e6} for t, c in swept[:4]]}
        best = f"{swept[0][1]} {swept[0][0] * 1e6:.1f} us, /cuBLAS {swept[0][0] / t_blas:.3f}" \
            if swept else "none ran"
        print(f"{name:9s} wide rows={m}: cuBLAS {t_blas * 1e6:7.1f} us "
              f"({n * k * 2 / t_blas / 1e12:.2f} TB/s); ours best {best}; max err {err}")
    return found


if __name__ == "__main__":
    main()
