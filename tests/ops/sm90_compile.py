"""Compile the paged-attention tile kernel for an H100/H200 (sm_90) on a machine without a GPU,
with Triton's ahead-of-time path (its bundled ptxas), and print what a test checks.

Run as a script in a process of its own (``TRITON_INTERPRET=0``): where there is no GPU the
test suite's processes run Triton interpreted (tests/conftest.py), and interpreted kernels
cannot be compiled. Prints one JSON line per (WRITE_KV, SPLIT_KV) variant.
"""
from __future__ import annotations

import inspect
import json
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from specdec_plugin.ops.paged_attention import triton as kernels

POINTERS = {"q_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16",
            "block_table_ptr": "*i32", "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32",
            "out_ptr": "*bf16", "part_acc_ptr": "*fp32", "part_max_ptr": "*fp32",
            "part_sum_ptr": "*fp32", "key_ptr": "*bf16", "value_ptr": "*bf16",
            "slot_mapping_ptr": "*i64", "qk_scale": "fp32"}


def compile_variant(write_kv: bool, split_kv: bool) -> dict:
    fn = kernels._attention_tile_kernel
    params = list(inspect.signature(fn.fn).parameters)
    # A 1+K verification tile of a Llama-7B-shaped layer: 32 query heads over 8 KV heads of 128.
    constants = dict(NUM_Q_HEADS=32, CACHE_BLOCK=16, GROUP=4, GROUP_PAD=4, BLOCK_Q=8,
                     BLOCK_M=32, BLOCK_N=32, HEAD=128, HEAD_PAD=128, SPLIT_KV=split_kv,
                     DOT_PRECISION="tf32", WRITE_KV=write_kv)
    signature = {p: "constexpr" if p in constants else POINTERS.get(p, "i32") for p in params}
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(params.index(n),): v for n, v in constants.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4, "num_stages": 2})
    ttgir = compiled.asm["ttgir"].split("\n")
    loops = [i for i, line in enumerate(ttgir) if "scf.for" in line]
    stores = [i for i, line in enumerate(ttgir) if "tt.store" in line]
    barriers = [i for i, line in enumerate(ttgir) if "gpu.barrier" in line]
    return {"write_kv": write_kv, "split_kv": split_kv, "loops": loops, "stores": stores,
            "barriers": barriers,
            "non_coherent_loads": len(re.findall(r"ld\.global\.nc", compiled.asm["ptx"]))}


if __name__ == "__main__":
    for write_kv in (False, True):
        for split_kv in (False, True):
            print(json.dumps(compile_variant(write_kv, split_kv)))
