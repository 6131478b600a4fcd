"""P16 (patches/gpu_linear.py) without a GPU, in a process of its own (the patch wraps vLLM's
classes and registers ``torch.ops.specdec.skinny_linear`` for the life of a process):

- routing: a non-CPU input that the CUDA device layer accepts (bfloat16, here on the ``meta``
  device, which runs the op's fake implementation) goes to the op, for linear layers and the
  LM head alike; a CPU input, or a float32 one, still runs vLLM's own ``apply``;
- the op under ``torch.compile`` with a dynamic number of rows (as vLLM compiles the model):
  registered for the CPU here with the torch reference as the kernel, it gives the reference's
  product up to the weight's ``max_rows`` (16, or 64 for a weight the wide tile serves) and
  ``F.linear``'s above, and the op's fake implementation traces;
- ``compile_variants`` (engine start): one launch on one row per distinct weight shape and bias
  among the modules whose product the patch routes, and one on 17 rows where ``max_rows``
  reaches the wide tile; none for float32, CPU or other modules.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    from specdec_plugin.device.cuda import skinny_gemm_accepts
    from specdec_plugin.ops.skinny_gemm import reference
    from specdec_plugin.patches import gpu_linear

    original = {cls: cls.apply for cls in (UnquantizedLinearMethod, UnquantizedEmbeddingMethod)}
    vllm_calls = []
    for cls, fn in original.items():
        def spy(self, layer, x, bias=None, _fn=fn):
            vllm_calls.append(x.device.type)
            return _fn(self, layer, x, bias)
        cls.apply = spy
    launched = []
    def kernel(x, weight, bias=None):
        launched.append((tuple(x.shape), tuple(weight.shape), bias is not None))
        return reference.skinny_gemm(x, weight, bias)
    # 64 rows for weights of 100 or more output columns (the wide tile), 16 for the rest.
    def max_rows(weight):
        return 64 if weight.shape[0] >= 100 else 16
    gpu_linear.apply(kernel, skinny_gemm_accepts, max_rows, "CPU")

    class Layer(torch.nn.Module):
        def __init__(self, weight):
            super().__init__()
            self.weight = torch.nn.Parameter(weight, requires_grad=False)

    for method in (UnquantizedLinearMethod(), UnquantizedEmbeddingMethod()):
        meta = Layer(torch.empty(48, 32, dtype=torch.bfloat16, device="meta"))
        y = method.apply(meta, torch.empty(2, 3, 32, dtype=torch.bfloat16, device="meta"))
        assert y.shape == (2, 3, 48) and y.device.type == "meta", y
        assert vllm_calls == [], vllm_calls  # the op, not vLLM's apply
        meta32 = Layer(torch.empty(48, 32, device="meta"))
        method.apply(meta32, torch.empty(3, 32, device="meta"))
        assert vllm_calls == ["meta"], vllm_calls  # float32 stays vLLM's
        cpu = Layer(torch.randn(48, 32, dtype=torch.bfloat16))
        x = torch.randn(3, 32, dtype=torch.bfloat16)
        assert torch.equal(method.apply(cpu, x), F.linear(x, cpu.weight))
        assert vllm_calls == ["meta", "cpu"], vllm_calls
        vllm_calls.clear()

    # compile_variants: one launch per distinct product the patch routes to the kernel.
    def module(method, n, k, dtype=torch.bfloat16, device="meta", bias=False, skip=False):
        layer = Layer(torch.empty(n, k, dtype=dtype, device=device))
        layer.quant_method, layer.skip_bias_add = method, skip
        layer.bias = torch.nn.Parameter(torch.empty(n, dtype=dtype, device=device),
                                        requires_grad=False) if bias else None
        return layer
    linear, head = UnquantizedLinearMethod(), UnquantizedEmbeddingMethod()
    modules = [module(linear, 48, 32), module(linear, 48, 32), module(linear, 64, 32, bias=True),
               module(linear, 80, 32, bias=True, skip=True), module(head, 100, 32),
               module(linear, 48, 32, dtype=torch.float32), module(linear, 48, 32, device="cpu"),
               torch.nn.Linear(32, 16)]
    launched.clear()
    assert gpu_linear.compile_variants([torch.nn.ModuleList(modules[:5]),
                                        torch.nn.ModuleList(modules[5:])]) == 4
    assert launched == [((1, 32), (48, 32), False), ((1, 32), (64, 32), True),
                        ((1, 32), (80, 32), False), ((1, 32), (100, 32), False),
                        ((17, 32), (100, 32), False)], launched

    for n, limit in ((64, 16), (128, 64)):
        w = torch.randn(n, 32, dtype=torch.bfloat16)
        b = torch.randn(n, dtype=torch.bfloat16)
        def f(x, w=w, b=b):
            return torch.ops.specdec.skinny_linear(torch.relu(x), w, b)
        compiled = torch.compile(f, dynamic=True)
        for rows in (1, 3, 16, 17, 40, 64, 65):
            x = torch.randn(rows, 32, dtype=torch.bfloat16)
            launched.clear()
            want = (reference.skinny_gemm(torch.relu(x), w, b) if rows <= limit
                    else F.linear(torch.relu(x), w, b))
            assert torch.equal(compiled(x), want), (n, rows)
            assert bool(launched) == (rows <= limit), (n, rows, launched)
    print("P16 OK")
''')


def test_p16_routes_few_row_half_precision_products_to_the_op():
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "P16 OK" in done.stdout


def test_cuda_device_installs_p16_only_when_asked(monkeypatch):
    """SPECDEC_SKINNY_GEMM=1 installs P16 with the Triton provider and the CUDA accept and
    row-limit rules;
    unset (the default) or under vLLM's batch-invariant mode, nothing is installed."""
    from specdec_plugin.device.cuda import CudaDevice, skinny_gemm_accepts
    from specdec_plugin.ops.skinny_gemm import triton as gemm_triton
    from specdec_plugin.patches import gpu_linear

    calls = []
    monkeypatch.setattr(gpu_linear, "apply", lambda *args: calls.append(args))
    for skinny, invariant, installed in (("", "0", False), ("1", "0", True), ("1", "1", False),
                                         ("0", "0", False)):
        monkeypatch.setenv("SPECDEC_SKINNY_GEMM", skinny)
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", invariant)
        calls.clear()
        CudaDevice().prepare_worker_process()
        assert bool(calls) == installed, (skinny, invariant)
        if installed:
            kernel, accepts, max_rows, key = calls[0]
            assert kernel is gemm_triton.skinny_gemm and accepts is skinny_gemm_accepts
            assert max_rows is gemm_triton.max_rows_worth_it
            assert key == "CUDA"
