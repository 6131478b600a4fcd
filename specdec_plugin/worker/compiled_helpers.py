"""vLLM's own ``torch.compile``d helpers that serving reaches, compiled at engine start.

Why: a few small functions in vLLM's sampling path are wrapped in ``torch.compile`` and
compile at their first call, which is some request's step: a stall that vLLM's JIT monitor
does not see (it watches Triton compiles only). ``batched_count_greater_than`` ranks the
sampled token among the vocabulary for every request that asks for logprobs, so the first such
request after start waits for it (0.4-0.5 s of Dynamo on this project's CPU, session 27; on a
GPU Inductor also generates and compiles a kernel). vLLM marks its batch dimension unbacked at
the call, so once compiled it serves every batch size without compiling again.

What: one call with the arguments the sampler passes (float32 log-probabilities over the
vocabulary, the gathered token log-probabilities, batch dimension unbacked) on devices whose
kernels compile at first use. The async computed-token correction, the other such helper on
the speculative path, is replaced outright (patch P14).
"""
from __future__ import annotations

import torch


def compile_logprob_ranks(device: torch.device, vocab_size: int) -> list[str]:
    """Compile vLLM's logprob rank counter for ``vocab_size``-wide rows; returns its name."""
    from vllm.v1.sample.ops.logprobs import batched_count_greater_than

    logprobs = torch.randn(2, vocab_size, device=device).log_softmax(dim=-1, dtype=torch.float32)
    token_logprobs = logprobs.gather(-1, torch.zeros(2, 1, dtype=torch.int64, device=device))
    # As vLLM's sampler does before each call (v1/sample/sampler.py, gather_logprobs).
    torch._dynamo.decorators.mark_unbacked(logprobs, 0)
    torch._dynamo.decorators.mark_unbacked(token_logprobs, 0)
    batched_count_greater_than(logprobs, token_logprobs)
    return ["batched_count_greater_than"]
