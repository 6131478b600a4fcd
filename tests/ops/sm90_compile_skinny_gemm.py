"""Compile the skinny GEMM for an H100/H200 (sm_90) on a machine without a GPU, with Triton's
ahead-of-time path, for the block config ``block_config`` chooses for each linear shape of the
7B benchmark model (132 multiprocessors, an H100 SXM) at the 16-row tile, and at the 64-row
tile for the shapes P16 gives it (``WIDE_SHAPES``), and print what a test checks.

Run as a script in a process of its own (``TRITON_INTERPRET=0``), as tests/ops/sm90_compile.py.
Prints one JSON line per shape and tile ("<shape>_wide" for the 64-row one), and one for a
split-K config of the benchmark's sweep.
"""
from __future__ import annotations

import inspect
import json
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from specdec_plugin.ops.skinny_gemm import triton as kernels
from specdec_plugin.ops.skinny_gemm.validate import MAX_ROWS, NARROW_ROWS

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336), "lm_head": (32000, 4096), "smollm2_qkv": (960, 576)}
H100_SMS = 132
# The shapes whose 17-64-row products P16 sends to the kernel (wide_tile_pays on an H100),
# SmolLM2's LM head among them.
WIDE_SHAPES = {"qkv": (6144, 4096), "gate_up": (28672, 4096), "lm_head": (32000, 4096),
               "smollm2_lm_head": (49152, 576)}
# Arguments Triton sees as multiples of 16 for these shapes (its usual specialisation).
_ALIGNED = ("x_ptr", "w_ptr", "b_ptr", "y_ptr", "part_ptr", "N", "K", "k_per_split",
            "stride_xm", "stride_wn", "stride_ym")


def compile_shape(name: str, n: int, k: int, config: tuple | None = None,
                  block_m: int = NARROW_ROWS) -> dict:
    fn = kernels._skinny_gemm_kernel
    params = list(inspect.signature(fn.fn).parameters)
    block_n, block_k, warps, stages, split_k = config or kernels.block_config(
        n, k, H100_SMS, block_m)
    constants = dict(HAS_BIAS=False, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                     EVEN_K=k % block_k == 0, SPLIT_K=split_k)
    pointers = {"part_ptr": "*fp32"}
    signature = {p: "constexpr" if p in constants else pointers.get(p) or
                 ("*bf16" if p.endswith("_ptr") else "i32") for p in params}
    aligned = {(params.index(p),): [["tt.divisibility", 16]] for p in _ALIGNED
               if p not in ("N", "K", "k_per_split") or {"N": n}.get(p, k) % 16 == 0}
    source = ASTSource(fn=fn, signature=signature, attrs=aligned,
                       constexprs={(params.index(c),): v for c, v in constants.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "num_stages": stages})
    ptx = compiled.asm["ptx"]
    return {"shape": name, "config": [block_n, block_k, warps, stages, split_k],
            "block_m": block_m, "shared_bytes": compiled.metadata.shared,
            "async_16_byte_copies": len(re.findall(r"cp\.async\.cg\.shared\.global[^\n]*16", ptx)),
            # Hopper's warp-group MMAs where Triton picks them (larger tiles), else mma.sync.
            "mma": len(re.findall(r"mma\.sync|wgmma\.mma_async", ptx))}


if __name__ == "__main__":
    for name, (n, k) in SHAPES.items():
        print(json.dumps(compile_shape(name, n, k)))
    for name, (n, k) in WIDE_SHAPES.items():
        print(json.dumps(compile_shape(f"{name}_wide", n, k, block_m=MAX_ROWS)))
    # A split-K config of the benchmark's sweep (the default uses none).
    print(json.dumps(compile_shape("down_split_4", 4096, 14336, (32, 256, 4, 4, 4))))
