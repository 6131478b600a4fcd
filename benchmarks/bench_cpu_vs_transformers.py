"""Decode throughput on CPU: vLLM through our platform against transformers' ``generate``.

    python benchmarks/bench_cpu_vs_transformers.py [--max-tokens 64] [--repeats 3] [--json out.json]

Same model (SmolLM2-135M-Instruct, fp32), same prompt token ids, greedy, EOS masked out on
both sides (min tokens = max tokens), the same number of new tokens, the same torch thread count
and OpenMP wait policy. Configurations: batch 1 (one
prompt per run; timed repeat r uses prompt r) and batch 8 (all prompts at once; transformers
pads on the left with an attention mask).

Two rates per side, each the median over the timed repeats, after one warm-up run:
- ``e2e``: generated tokens / wall seconds of the whole call (prefill included) -- the headline;
- ``decode``: batch * (N - 1) / (t(N new tokens) - t(1 new token)), i.e. the rate of the decode
  steps alone, with the prefill and the first token subtracted out.

Ours is vLLM's ``LLM`` with ``enforce_eager=True``, prefix caching off (transformers recomputes
every prompt too), in vLLM's default process layout (engine core in a child process) unless
``--in-process``. Timed runs of the two sides alternate, so that load from other jobs on the
machine hits both alike.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# Prompts of about 20-60 tokens; the same token ids go to both sides.
PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle that was sent "
    "by her grandmother many years ago.",
    "Explain, step by step and in plain words, how a refrigerator keeps food cold.",
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined several existing technologies into a single machine that",
    "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n",
    "List five reasons why people enjoy hiking in the mountains during the summer months, and "
    "give one sentence of explanation for each reason.",
    "Question: A train travels 120 kilometers in 90 minutes. What is its average speed in "
    "kilometers per hour?\nAnswer:",
    "Dear hiring committee, I am writing to apply for the position of junior data analyst at "
    "your company. Over the past two years I have",
    "Translate the following sentence into French and then explain the grammar: The children "
    "were playing in the garden when it started to rain heavily.",
]


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        with open("/proc/loadavg") as f:
            return "loadavg " + f.read().strip()


class OursRunner:
    def __init__(self, model: str, **engine) -> None:
        """``engine``: LLM arguments that replace this benchmark's (bench_cpu_side_by_side.py
        passes a speculative config and its own lengths)."""
        from vllm import LLM

        args = dict(dtype="float32", enforce_eager=True, max_model_len=1024,
                    enable_prefix_caching=False, max_num_seqs=len(PROMPTS), seed=0)
        self.llm = LLM(model=model, **{**args, **engine})

    def generate(self, batch: list[list[int]], max_tokens: int) -> list[list[int]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # min_tokens as well as ignore_eos: transformers' min_new_tokens masks EOS out of the
        # logits, and vLLM's ignore_eos alone would still pick EOS where it is the argmax.
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, min_tokens=max_tokens,
                                ignore_eos=True)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], params,
                                 use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def close(self) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        if engine is not None and hasattr(engine, "engine_core"):
            engine.engine_core.shutdown()


class TransformersRunner:
    def __init__(self, model: str, pad_token_id: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        self.pad = pad_token_id

    def generate(self, batch: list[list[int]], max_tokens: int) -> list[list[int]]:
        torch = self.torch
        width = max(len(p) for p in batch)
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens,
                min_new_tokens=max_tokens, do_sample=False, num_beams=1,
                pad_token_id=self.pad,
            )
        return out[:, width:].tolist()


def _timed(runner, batch, max_tokens):
    t0 = time.perf_counter()
    out = runner.generate(batch, max_tokens)
    return time.perf_counter() - t0, out


def run(args) -> dict:
    import torch
    from transformers import AutoTokenizer

    from specdec_plugin.models import fetch_smollm2

    model = str(args.model or fetch_smollm2())
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt_ids = [tokenizer(p).input_ids for p in PROMPTS]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    torch.set_num_threads(args.threads)
    ours = OursRunner(model)
    hf = TransformersRunner(model, pad)
    sides = {"ours": ours, "hf": hf}

    configs = {"batch1": 1, "batch8": len(PROMPTS)}
    results: dict[str, dict] = {}
    n = args.max_tokens
    for name, size in configs.items():
        def batch_for(rep: int) -> list[list[int]]:
            if size == 1:
                return [prompt_ids[rep % len(prompt_ids)]]
            return prompt_ids[:size]

        times = {s: {"full": [], "one": []} for s in sides}
        agree = []
        for side, runner in sides.items():  # warm-up: both lengths, untimed
            t_warm, _ = _timed(runner, batch_for(0), n)
            runner.generate(batch_for(0), 1)
            print(f"[{name}] warm-up {side}: {t_warm:.2f} s", file=sys.stderr, flush=True)
        for rep in range(args.repeats):
            batch = batch_for(rep)
            outs = {}
            for side, runner in sides.items():
                t_full, outs[side] = _timed(runner, batch, n)
                t_one, _ = _timed(runner, batch, 1)
                times[side]["full"].append(t_full)
                times[side]["one"].append(t_one)
                print(f"[{name}] repeat {rep} {side}: {t_full:.2f} s for {n} tokens, "
                      f"{t_one:.2f} s for 1", file=sys.stderr, flush=True)
            agree.append(sum(a == b for a, b in zip(outs["ours"], outs["hf"])) / len(batch))
            assert all(len(o) == n for o in outs["ours"]), "ours generated the wrong length"
        row = {"batch": size, "max_tokens": n, "repeats": args.repeats,
               "greedy_agreement": statistics.mean(agree)}
        for side in sides:
            full = times[side]["full"]
            one = times[side]["one"]
            row[f"{side}_e2e_tok_s"] = statistics.median(size * n / t for t in full)
            decode = [size * (n - 1) / (f - o) for f, o in zip(full, one) if f > o]
            row[f"{side}_decode_tok_s"] = statistics.median(decode) if decode else float("nan")
            row[f"{side}_wall_s"] = full
        row["e2e_ratio"] = row["ours_e2e_tok_s"] / row["hf_e2e_tok_s"]
        row["decode_ratio"] = row["ours_decode_tok_s"] / row["hf_decode_tok_s"]
        results[name] = row
        print(f"[{name}] done", file=sys.stderr, flush=True)
    ours.close()
    return {"model": model, "prompt_tokens": [len(p) for p in prompt_ids],
            "threads": args.threads, "in_process": args.in_process,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "configs": results}


def print_table(report: dict) -> None:
    header = ("| config | ours tok/s | transformers tok/s | ratio ours/hf | ours decode tok/s "
              "| hf decode tok/s | decode ratio | greedy agreement |")
    print(header)
    print("| --- " * (header.count("|") - 1) + "|")
    for name, r in report["configs"].items():
        print(f"| {name} ({r['max_tokens']} new tokens) | {r['ours_e2e_tok_s']:.1f} | "
              f"{r['hf_e2e_tok_s']:.1f} | {r['e2e_ratio']:.2f} | {r['ours_decode_tok_s']:.1f} | "
              f"{r['hf_decode_tok_s']:.1f} | {r['decode_ratio']:.2f} | "
              f"{r['greedy_agreement']:.0%} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--in-process", action="store_true",
                        help="run vLLM's engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    # Both sides get the same thread count; a small KV cache is plenty for 8 short requests.
    os.environ["SPECDEC_CPU_THREADS"] = str(args.threads)
    # Our platform makes its engine process wait passively in OpenMP; transformers runs in this
    # process, whose OpenMP pool reads the variable once, when torch loads (below, in run()).
    # Without it, spinning idle threads made transformers 4-5x slower on a busy machine.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("SPECDEC_CPU_KV_CACHE_GIB", "0.25")
    if args.in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

    load_before = _uptime()
    started = time.perf_counter()
    report = run(args)
    report["wall_s"] = time.perf_counter() - started
    report["uptime_before"] = load_before
    report["uptime_after"] = _uptime()
    report["date"] = time.strftime("%Y-%m-%d %H:%M:%S")

    print()
    print_table(report)
    print(f"\nprompt tokens: {report['prompt_tokens']}  threads: {args.threads}  "
          f"in-process engine: {args.in_process}  whole run: {report['wall_s']:.0f} s")
    print(f"before: {report['uptime_before']}\nafter:  {report['uptime_after']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
