"""vLLM's logprob rank counter compiled at start-up (specdec_plugin/worker/compiled_helpers.py):
the start-up call compiles it, and the sampler's later calls at other batch sizes compile
nothing and count right. In a fresh process, so that no earlier test has compiled it."""
from __future__ import annotations

import json
import random
import subprocess
import sys

_SCRIPT = r"""
import json, sys, torch
from torch._dynamo.utils import counters
from vllm.v1.sample.ops.logprobs import batched_count_greater_than
from specdec_plugin.worker.compiled_helpers import compile_logprob_ranks

vocab, batches = int(sys.argv[1]), json.loads(sys.argv[2])
frames = lambda: sum(counters["frames"].values())
out = {}
with torch.inference_mode():
    before = frames()
    compile_logprob_ranks(torch.device("cpu"), vocab)
    out["at_start"] = frames() - before
    before = frames()
    out["right"] = []
    for batch in batches:
        logprobs = torch.randn(batch, vocab).log_softmax(dim=-1, dtype=torch.float32)
        token = logprobs.gather(-1, torch.randint(0, vocab, (batch, 1)))
        # What vLLM's sampler does before each call (v1/sample/sampler.py).
        torch._dynamo.decorators.mark_unbacked(logprobs, 0)
        torch._dynamo.decorators.mark_unbacked(token, 0)
        ranks = batched_count_greater_than(logprobs, token)
        out["right"].append(bool(torch.equal(ranks, (logprobs >= token).sum(-1))))
    out["while_serving"] = frames() - before
print("RESULT " + json.dumps(out))
"""


def test_logprob_ranks_compile_at_start_and_never_again():
    vocab = random.randint(1000, 5000)
    batches = [1, random.randint(2, 9), random.randint(10, 70), 1]
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(vocab), json.dumps(batches)],
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    result = json.loads(lines[0][len("RESULT "):])
    assert result["at_start"] > 0  # the start-up call compiled it
    assert result["while_serving"] == 0, result  # nothing after it, at any batch size
    assert all(result["right"]), (batches, result)
