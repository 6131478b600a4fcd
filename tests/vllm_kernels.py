"""vLLM 0.26's own Triton kernels, compiled by the real ``triton.jit`` from their installed
source (vLLM swaps in a placeholder when Triton has no driver; on CPU ``TRITON_INTERPRET=1``
runs them). Tests compare our kernels and our rejection sampler against them."""
from __future__ import annotations

import ast
import importlib.util
import os
import tempfile

import pytest


def load_vllm_kernels(relpath: str, names: list[str]):
    """vLLM's kernels compiled by the real ``triton.jit`` (vLLM itself swaps in a placeholder
    when Triton has no driver): their source is cut out of the installed file and re-imported."""
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        pytest.skip("vllm not installed")
    path = os.path.join(spec.submodule_search_locations[0], relpath)
    text = open(path).read()
    lines = text.splitlines()
    chunks = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            chunks.append("\n".join(lines[first - 1 : node.end_lineno]))
    assert len(chunks) == len(names), f"missing kernels in {relpath}"
    tmp = tempfile.mkdtemp(prefix="vllm_kernels_")
    mod_path = os.path.join(tmp, "vllm_kernels_" + "_".join(sorted(names))[:40] + ".py")
    with open(mod_path, "w") as f:
        f.write("import triton\nimport triton.language as tl\n\n" + "\n\n".join(chunks) + "\n")
    mspec = importlib.util.spec_from_file_location(os.path.basename(mod_path)[:-3], mod_path)
    module = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(module)
    return module
