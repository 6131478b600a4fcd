"""RMSNorm, rotary embedding and SiLU-and-mul on a CUDA device: our Triton kernels vs
torch.compile of the torch reference vs the eager torch reference (what vLLM runs with
custom ops disabled, fused by inductor / not fused at all).

    python benchmarks/bench_elementwise_kernels.py                  # all ops, 1..512 tokens
    python benchmarks/bench_elementwise_kernels.py --ops rms_norm --tokens 1 80

Shapes are 7B-class (Llama-3-8B / Mistral-7B): hidden 4096, intermediate 14336, 32 query and 8
kv heads of 128, bf16; token counts are decode / 1+K verification / small-prefill sizes.
One JSON line per (op, tokens), times in microseconds, each the median over repeats of the
mean of a back-to-back batch of calls, measured with CUDA events after warm-up:
- "eager_us": calls launched from Python (launch overhead included: enforce_eager, or an
  eager drafter);
- "graph_us": the same calls captured in a CUDA graph and replayed (kernel time as seen by
  decode / verification under CUDA graphs).
"fastest_eager" / "fastest_graph" name the winner; "maxdiff" is each provider's largest
absolute difference from the eager reference (a wrong kernel shows there, not as a fast time).
torch.compile uses its defaults (inductor, automatic dynamic shapes), so each op compiles
about twice: once for the first token count, once more when the token count changes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HIDDEN, INTERMEDIATE, Q_HEADS, KV_HEADS, HEAD = 4096, 14336, 32, 8, 128
MAX_POSITION = 8192
DEVICE = "cuda"
OPS = ("rms_norm", "fused_add_rms_norm", "rotary_neox", "rotary_gptj", "silu_and_mul")
TOKENS = (1, 5, 16, 80, 512)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make_case(op: str, tokens: int, dtype: torch.dtype):
    """(fn(impl) -> zero-arg callable, output getter) for one op and token count; ``impl`` is
    a function with the op's registry signature. Inputs are fresh random values on the GPU."""
    dev = DEVICE
    if op in ("rms_norm", "fused_add_rms_norm"):
        x = torch.randn(tokens, HIDDEN, device=dev, dtype=dtype)
        weight = (1 + 0.1 * torch.randn(HIDDEN, device=dev)).to(dtype)
        residual = torch.randn_like(x) if op == "fused_add_rms_norm" else None
        return lambda impl: (lambda: impl(x, weight, 1e-5, residual))
    if op == "silu_and_mul":
        x = torch.randn(tokens, 2 * INTERMEDIATE, device=dev, dtype=dtype)
        return lambda impl: (lambda: impl(x))
    # rotary: q and k are column views of a fused qkv buffer, rotated in place
    is_neox = op == "rotary_neox"
    qkv = torch.randn(tokens, (Q_HEADS + 2 * KV_HEADS) * HEAD, device=dev, dtype=dtype)
    q, k = qkv[:, : Q_HEADS * HEAD], qkv[:, Q_HEADS * HEAD: (Q_HEADS + KV_HEADS) * HEAD]
    cache = torch.randn(MAX_POSITION, HEAD, device=dev).to(dtype)
    positions = torch.randint(0, MAX_POSITION, (tokens,), device=dev)

    def bind(impl):
        def run():
            impl(positions, q, k, cache, HEAD, HEAD, is_neox)
            return qkv
        return run
    return bind


def first_tensor(out):
    return out[0] if isinstance(out, tuple) else out


def max_diff(op, tokens, dtype, impl, ref) -> float:
    """Largest |impl - ref| on identical fresh inputs (rotary: one rotation of the same qkv)."""
    torch.manual_seed(tokens)
    a = first_tensor(make_case(op, tokens, dtype)(impl)())
    torch.manual_seed(tokens)
    b = first_tensor(make_case(op, tokens, dtype)(ref)())
    return (a.float() - b.float()).abs().max().item()


def time_eager(fn, inner: int, repeats: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / inner)
    return statistics.median(times)


def time_graph(fn, inner: int, repeats: int) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the capture stream, as torch advises
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    return time_eager(graph.replay, 1, repeats) / inner


def providers(compile_mode: str | None):
    from specdec_plugin.ops.registry import get_kernel

    table = {}
    for op_name in ("rms_norm", "rotary_embedding", "silu_and_mul"):
        ref = get_kernel(op_name, ("torch",))
        impls = {"triton": get_kernel(op_name, ("triton",)), "eager": ref}
        if compile_mode is not None:
            impls["compiled"] = (torch.compile(ref) if compile_mode == "default"
                                 else torch.compile(ref, mode=compile_mode))
        table[op_name] = impls
    return table


def registry_op(op: str) -> str:
    return {"fused_add_rms_norm": "rms_norm", "rotary_neox": "rotary_embedding",
            "rotary_gptj": "rotary_embedding"}.get(op, op)


def run_case(op, tokens, dtype, impls, args) -> dict:
    bind = make_case(op, tokens, dtype)
    result = {"op": op, "tokens": tokens, "dtype": args.dtype, "eager_us": {}, "graph_us": {},
              "maxdiff": {}}
    for name, impl in impls.items():
        fn = bind(impl)
        for _ in range(args.warmup):  # compiles, autotunes, fills caches
            fn()
        torch.cuda.synchronize()
        result["eager_us"][name] = round(time_eager(fn, args.inner, args.repeats), 2)
        if not args.no_graph:
            try:
                result["graph_us"][name] = round(time_graph(fn, args.inner, args.repeats), 2)
            except Exception as e:  # report and go on: one provider's capture must not stop all
                result["graph_us"][name] = None
                result.setdefault("errors", {})[name] = f"graph: {type(e).__name__}: {e}"[:200]
        if name != "eager":
            result["maxdiff"][name] = max_diff(op, tokens, dtype, impl, impls["eager"])
    for mode in ("eager", "graph"):
        times = {k: v for k, v in result[f"{mode}_us"].items() if v is not None}
        if times:
            result[f"fastest_{mode}"] = min(times, key=times.get)
    return result


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--compile-mode", default="default",
                        help='torch.compile mode ("default", "max-autotune-no-cudagraphs", ...) '
                             'or "off" to skip the compiled provider')
    parser.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph timings")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--inner", type=int, default=20, help="calls per timed batch")
    parser.add_argument("--repeats", type=int, default=15, help="timed batches (median)")
    args = parser.parse_args(argv)
    if min(args.tokens) < 1:
        parser.error("--tokens must be positive")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_elementwise_kernels: no CUDA device (torch.cuda.is_available() is False); "
              "run it on a GPU machine.", file=sys.stderr)
        return 2
    started = time.perf_counter()
    dtype = DTYPES[args.dtype]
    table = providers(None if args.compile_mode == "off" else args.compile_mode)
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "compile_mode": args.compile_mode}), flush=True)
    for op in args.ops:
        for tokens in args.tokens:
            torch.manual_seed(tokens)
            print(json.dumps(run_case(op, tokens, dtype, table[registry_op(op)], args)),
                  flush=True)
    print(json.dumps({"total_s": round(time.perf_counter() - started, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
