"""Paged-attention kernel timings on a CUDA device: ours vs vLLM's Triton unified attention vs
FlashAttention (vLLM's build), for decode (1 query token) and speculative verification
(1+K query tokens) at a few batch sizes and context lengths.

    python benchmarks/bench_attention_kernels.py            # Llama-7B heads: 32 q / 32 kv, 128
    python benchmarks/bench_attention_kernels.py --gqa      # Llama-3-8B-like: 32 q / 8 kv, 128

Each number is a median in microseconds, after warm-up: "eager" is triton.testing.do_bench
(includes Python launch overhead whenever that exceeds the kernel time), "graph" is
triton.testing.do_bench_cudagraph (kernel time as seen under CUDA graphs, which is how decode and
verification run in vLLM). "x" columns are other/ours (above 1 means ours is faster).
Every competitor's output is compared with ours first, so a wrong comparison shows up as a
large "maxdiff" instead of a fast time.
Providers that cannot be imported are reported and skipped.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from specdec_plugin.ops.paged_attention.triton import paged_attention  # noqa: E402


def make_inputs(batch, q_len, ctx, hq, hkv, head, block_size, dtype):
    seq_len = ctx + q_len
    blocks_per_seq = triton.cdiv(seq_len, block_size)
    num_blocks = batch * blocks_per_seq + 1
    block_table = torch.randperm(num_blocks - 1, device="cuda")[: batch * blocks_per_seq]
    block_table = block_table.view(batch, blocks_per_seq).to(torch.int32)
    k_cache = torch.randn(num_blocks, block_size, hkv, head, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch * q_len, hq, head, device="cuda", dtype=dtype)
    cu_q = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * q_len
    seq_lens = torch.full((batch,), seq_len, device="cuda", dtype=torch.int32)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, cu_q=cu_q,
                seq_lens=seq_lens, q_len=q_len, seq_len=seq_len, scale=head ** -0.5)


def ours(x):
    out = torch.empty_like(x["q"])

    def run():
        paged_attention(x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["cu_q"],
                        x["seq_lens"], x["scale"], out, x["q_len"], x["seq_len"])
    return run, out


def vllm_triton(x):
    from vllm.v1.attention.backends.triton_attn import (MIN_LAUNCH_GRID_SIZE_2D,
                                                        NUM_PAR_SOFTMAX_SEGMENTS)
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention

    out = torch.empty_like(x["q"])
    hq, head = x["q"].shape[1], x["q"].shape[2]
    # Same split-softmax workspaces vLLM's TRITON_ATTN metadata builder allocates, so its
    # decode path (3D kernel) is used where vLLM would use it.
    threshold = MIN_LAUNCH_GRID_SIZE_2D // x["k_cache"].shape[2]
    segs = NUM_PAR_SOFTMAX_SEGMENTS
    segm_out = torch.empty(threshold, hq, segs, triton.next_power_of_2(head),
                           device="cuda", dtype=torch.float32)
    segm_max = torch.empty(threshold, hq, segs, device="cuda", dtype=torch.float32)
    segm_sum = torch.empty_like(segm_max)

    def run():
        unified_attention(
            q=x["q"], k=x["k_cache"], v=x["v_cache"], out=out, cu_seqlens_q=x["cu_q"],
            max_seqlen_q=x["q_len"], seqused_k=x["seq_lens"], max_seqlen_k=x["seq_len"],
            softmax_scale=x["scale"], causal=True, window_size=(-1, -1),
            block_table=x["block_table"], softcap=0, q_descale=None, k_descale=None,
            v_descale=None, seq_threshold_3D=threshold, num_par_softmax_segments=segs,
            softmax_segm_output=segm_out, softmax_segm_max=segm_max,
            softmax_segm_expsum=segm_sum,
        )
    return run, out


def flash_attention(x):
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    out = torch.empty_like(x["q"])
    version = 3 if torch.cuda.get_device_capability()[0] == 9 else 2

    def run():
        flash_attn_varlen_func(
            q=x["q"], k=x["k_cache"], v=x["v_cache"], max_seqlen_q=x["q_len"],
            cu_seqlens_q=x["cu_q"], max_seqlen_k=x["seq_len"], seqused_k=x["seq_lens"],
            softmax_scale=x["scale"], causal=True, block_table=x["block_table"], out=out,
            fa_version=version,
        )
    return run, out


PROVIDERS = {"vllm-triton": vllm_triton, "flash-attn": flash_attention}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gqa", action="store_true", help="32 q heads / 8 kv heads")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--spec", type=int, default=4, help="K draft tokens: verify q = 1+K")
    parser.add_argument("--timer", choices=["graph", "eager", "both"], default="both")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA device")
    dtype = getattr(torch, args.dtype)
    hq, hkv, head = (32, 8, 128) if args.gqa else (32, 32, 128)
    print(f"{torch.cuda.get_device_name()}  heads {hq}/{hkv}x{head}  {args.dtype}  "
          f"block {args.block_size}  (us, median)")

    available = {}
    probe = make_inputs(1, 1, 16, hq, hkv, head, args.block_size, dtype)
    for name, make in PROVIDERS.items():
        try:
            make(probe)[0]()
            available[name] = make
        except Exception as exc:  # import or launch failure: report and go on
            print(f"  skipping {name}: {type(exc).__name__}: {str(exc)[:120]}")

    for timer in (("graph", "eager") if args.timer == "both" else (args.timer,)):
        print(f"-- {timer} timing")
        table(available, timer, hq, hkv, head, args, dtype)


def measure(fn, timer):
    # do_bench_cudagraph runs on a side stream that does not wait for the default stream:
    # without this, it can read inputs that are still being written (e.g. the block table).
    torch.cuda.synchronize()
    if timer == "graph":
        return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def table(available, timer, hq, hkv, head, args, dtype):
    header = f"{'case':<10}{'batch':>6}{'ctx':>6}{'ours':>9}"
    for name in available:
        header += f"{name:>13}{'x':>7}{'maxdiff':>9}"
    print(header)
    for label, q_len in (("decode", 1), ("verify", 1 + args.spec)):
        for batch in (1, 16):
            for ctx in (512, 2048):
                x = make_inputs(batch, q_len, ctx, hq, hkv, head, args.block_size, dtype)
                run, ours_out = ours(x)
                run()
                t_ours = measure(run, timer)
                row = f"{label:<10}{batch:>6}{ctx:>6}{t_ours * 1e3:>9.1f}"
                for name, make in available.items():
                    other, other_out = make(x)
                    other()
                    diff = (other_out.float() - ours_out.float()).abs().max().item()
                    t = measure(other, timer)
                    row += f"{t * 1e3:>13.1f}{t / t_ours:>7.2f}{diff:>9.1e}"
                print(row)


if __name__ == "__main__":
    main()
