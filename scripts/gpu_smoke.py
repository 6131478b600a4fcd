"""On an NVIDIA GPU: greedy tokens of a tiny model through our plugin (cuda mode) against vLLM's
own CUDA backend, plain and with n-gram speculation. Each engine runs in its own subprocess
(VLLM_PLUGINS="" selects vLLM's own platform). Prints one JSON line per run and a verdict.

    python scripts/gpu_smoke.py [--arch qwen3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r'''
import json, sys
from vllm import LLM, SamplingParams
from vllm.platforms import current_platform
path, spec = sys.argv[1], json.loads(sys.argv[2])
if __name__ == "__main__":
    llm = LLM(model=path, dtype="float32", max_model_len=256, enforce_eager=True, seed=0,
              gpu_memory_utilization=0.3, speculative_config=spec or None)
    prompts = ["def add(a, b):", "import os\nimport sys\n", "1 2 3 1 2 3 1 2 3"]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    print("RESULT " + json.dumps({"platform": type(current_platform).__name__,
                                  "tokens": [list(o.outputs[0].token_ids) for o in outs]}), flush=True)
'''


def run(path: str, spec: dict | None, native: bool) -> dict:
    env = {**os.environ}
    if native:
        env["VLLM_PLUGINS"] = ""
    proc = subprocess.run([sys.executable, "-c", CHILD, path, json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
    return {"error": proc.returncode}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="qwen3")
    args = parser.parse_args()
    from specdec_plugin.models import tiny_checkpoint

    path = str(tiny_checkpoint(args.arch))
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    results = {
        "native": run(path, None, native=True),
        "ours": run(path, None, native=False),
        "ours+ngram": run(path, ngram, native=False),
    }
    for name, result in results.items():
        print(name, json.dumps(result))
    same = all("tokens" in r and r["tokens"] == results["native"].get("tokens") for r in results.values())
    print("VERDICT", "same greedy tokens" if same else "DIFFERENT or failed")


if __name__ == "__main__":
    main()
