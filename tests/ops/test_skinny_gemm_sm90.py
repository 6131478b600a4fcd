"""The skinny GEMM compiles for sm_90 (H100/H200) here, without a GPU, for the block config each
of the 7B benchmark model's linear shapes gets (and the 64-row tile's, where P16 uses it): its
weight tiles stream through 16-byte asynchronous copies into shared memory (the software
pipeline), the products are tensor-core MMAs, and a program's shared memory fits one
multiprocessor's (227 KB on Hopper), so no config fails to launch for lack of it.
tests/ops/sm90_compile_skinny_gemm.py does the compiling."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

HOPPER_SHARED_PER_BLOCK = 227 * 1024


@pytest.fixture(scope="module")
def shapes() -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "tests.ops.sm90_compile_skinny_gemm"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {row["shape"]: row for row in rows}


def test_every_shape_compiles_to_pipelined_tensor_core_code(shapes):
    from tests.ops.sm90_compile_skinny_gemm import SHAPES, WIDE_SHAPES

    assert set(shapes) == set(SHAPES) | {"down_split_4"} | {f"{s}_wide" for s in WIDE_SHAPES}
    for name, row in shapes.items():
        assert row["async_16_byte_copies"] > 0, row
        assert row["mma"] > 0, row
        assert 0 < row["shared_bytes"] <= HOPPER_SHARED_PER_BLOCK, row
