"""Each supported architecture family matches transformers' greedy output through our platform:
tiny random-weight checkpoints for Llama, Qwen2 (QKV bias), Qwen3 (q/k norm) and OPT."""
from __future__ import annotations

import pytest

from tests.hf_reference import hf_greedy_token_ids, tokenize

pytestmark = pytest.mark.slow

PROMPTS = ["def add(a, b):", "import os\nimport sys\n", "class Point:\n    def __init__(self"]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "opt"])
def test_tiny_architecture_matches_transformers(engines, arch):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from specdec_plugin.models import tiny_checkpoint

    path = str(tiny_checkpoint(arch))
    ids = [tokenize(path, p) for p in PROMPTS]
    expected = [hf_greedy_token_ids(path, p, 16) for p in ids]
    assert any(len(set(e)) > 3 for e in expected), "random weights too flat to test anything"

    llm = engines.get(path, max_model_len=256, enable_prefix_caching=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids],
                        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    assert [list(o.outputs[0].token_ids) for o in outs] == expected
