"""The paged-attention tile kernel compiles for sm_90 (H100/H200) here, without a GPU, in each
(WRITE_KV, SPLIT_KV) variant; with WRITE_KV its stores come first, then a block barrier, then
the attention loop, and no variant reads global memory through the non-coherent path (which
could return a key the same launch just wrote as it was before). A compile error in a kernel
variant otherwise first shows on a lent GPU (tests/ops/sm90_compile.py does the compiling)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def variants() -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "tests.ops.sm90_compile"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {(row["write_kv"], row["split_kv"]): row for row in rows}


def test_every_variant_compiles(variants):
    assert set(variants) == {(w, s) for w in (False, True) for s in (False, True)}
    assert all(row["non_coherent_loads"] == 0 for row in variants.values()), variants


@pytest.mark.parametrize("split_kv", [False, True])
def test_the_kv_write_comes_before_a_barrier_and_the_attention_loop(variants, split_kv):
    row = variants[(True, split_kv)]
    write_loop, attention_loop = row["loops"][:2]
    writes = [i for i in row["stores"] if write_loop < i < attention_loop]
    assert len(writes) == 2, row  # the key and the value
    assert any(max(writes) < b < attention_loop for b in row["barriers"]), row
    plain = variants[(False, split_kv)]
    assert len(plain["loops"]) == len(row["loops"]) - 1  # WRITE_KV=False compiles it away
