"""Host cost of one eager attention layer call: ours against vLLM's FlashAttention path.

vLLM runs a drafter's attention outside CUDA graphs (PIECEWISE), so each drafter layer pays the
host cost of its attention launches on the critical path: the GPU work of a 1-token step is a
few microseconds, the launch path tens. This measures, on the GPU machine, the host time per
call (launch N calls back to back without synchronising, median over repeats; the GPU work is
far shorter, so the host sets the pace) of:

- ours: the KV write + paged attention (target-style launch: split-KV with its merge kernel),
- ours, ``host_bound=True`` (how drafter steps launch: no split below long contexts),
- vLLM's: ``reshape_and_cache_flash`` + FlashAttention 3 ``flash_attn_varlen_func``,

at a 7B drafter layer's shape (32 query / 8 KV heads of 128, bf16, block 16), batch 1 and 16,
query 1 (drafting) and 5 (1+K verification), context 448.

    python3 benchmarks/bench_launch_overhead.py [--calls 200] [--repeats 7]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _case(batch: int, q_len: int, context: int, device="cuda", dtype=torch.bfloat16):
    hq, hkv, head, block = 32, 8, 128, 16
    blocks_per_seq = (context + block - 1) // block
    num_blocks = batch * blocks_per_seq + 8
    k_cache = torch.randn(num_blocks, block, hkv, head, device=device, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(num_blocks, device=device)[: batch * blocks_per_seq]
    table = table.view(batch, blocks_per_seq).to(torch.int32)
    tokens = batch * q_len
    qkv = torch.randn(tokens, hq + 2 * hkv, head, device=device, dtype=dtype)
    q, k, v = qkv[:, :hq], qkv[:, hq: hq + hkv], qkv[:, hq + hkv:]
    qsl = torch.arange(0, tokens + 1, q_len, device=device, dtype=torch.int32)
    seq_lens = torch.full((batch,), context, device=device, dtype=torch.int32)
    pos = torch.arange(context - q_len, context, device=device)
    slots = (table[:, pos // block].long() * block + pos % block).reshape(-1)
    return dict(q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, table=table, qsl=qsl,
                seq_lens=seq_lens, slots=slots, q_len=q_len, context=context,
                out=torch.empty_like(q), scale=head ** -0.5)


def _ours(c, host_bound: bool):
    from specdec_plugin.ops.paged_attention.triton import paged_attention
    from specdec_plugin.ops.reshape_and_cache.triton import reshape_and_cache

    def call():
        reshape_and_cache(c["k"], c["v"], c["k_cache"], c["v_cache"], c["slots"])
        paged_attention(c["q"], c["k_cache"], c["v_cache"], c["table"], c["qsl"], c["seq_lens"],
                        c["scale"], c["out"], c["q_len"], c["context"], host_bound=host_bound)
    return call


def _vllm_flash(c):
    from vllm import _custom_ops as ops
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    one = torch.tensor(1.0, device="cuda")

    def call():
        ops.reshape_and_cache_flash(c["k"], c["v"], c["k_cache"], c["v_cache"], c["slots"],
                                    "auto", one, one)
        flash_attn_varlen_func(q=c["q"], k=c["k_cache"], v=c["v_cache"], out=c["out"],
                               cu_seqlens_q=c["qsl"], max_seqlen_q=c["q_len"],
                               seqused_k=c["seq_lens"], max_seqlen_k=c["context"],
                               softmax_scale=c["scale"], causal=True, block_table=c["table"],
                               fa_version=3)
    return call


def _host_us_per_call(call, calls: int, repeats: int) -> float:
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--context", type=int, default=448)
    args = p.parse_args()
    variants = {"ours": lambda c: _ours(c, False), "ours_host_bound": lambda c: _ours(c, True),
                "vllm_fa3": _vllm_flash}
    rows = []
    for batch in (1, 16):
        for q_len in (1, 5):
            case = _case(batch, q_len, args.context)
            row = {"batch": batch, "q_len": q_len, "context": args.context}
            for name, make in variants.items():
                try:
                    row[f"{name}_host_us"] = round(_host_us_per_call(make(case), args.calls,
                                                                     args.repeats), 2)
                except Exception as exc:  # report, keep measuring the others
                    row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:200]
            rows.append(row)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
