"""The rejection sampler's greedy path against its general path, same inputs, one process.

Why: for an all-greedy step with nothing editing the logits, ``SpecDecRejectionSampler`` now
takes one argmax over the raw logits (``_greedy_forward``) instead of the general path's
float32 copies, clone and sampler pass over the bonus rows. This times both paths (the
general one forced by patching ``argmax_decides``) on random logits, per batch size, draft
length and vocabulary, alternating the two in blocks, and prints the ratio. Both must give the
same tokens; the script checks that too. On a GPU the time is taken with CUDA events around each
call (host and device together, the device synchronised after each call); elsewhere with
``perf_counter``.

    python benchmarks/bench_rejection_greedy.py [--vocab 32000,128256] [--batches 1,16,64] [--k 2,4] [--json OUT]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo


def _inputs(batch: int, k: int, vocab: int, device: torch.device, dtype: torch.dtype):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    drafts = [torch.randint(0, vocab, (k,)).tolist() for _ in range(batch)]
    meta = SpecDecodeMetadata.make_dummy(drafts, device)
    bonus = torch.arange(1, batch + 1) * (k + 1) - 1
    meta.bonus_logits_indices = bonus.to(device)
    meta.target_logits_indices = torch.tensor(
        [i for b in bonus.tolist() for i in range(b - k, b)], device=device)
    sm = SamplingMetadata(
        temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None,
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch, device=device),
        presence_penalties=torch.zeros(batch, device=device),
        repetition_penalties=torch.ones(batch, device=device),
        output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None,
        bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    logits = torch.randn(batch * (k + 1), vocab, device=device).to(dtype)
    return meta, logits, sm


def _timer(device: torch.device):
    if device.type == "cuda":
        def timed(fn):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e3, out
    else:
        def timed(fn):
            t = time.perf_counter()
            out = fn()
            return (time.perf_counter() - t) * 1e6, out
    return timed


def main() -> None:
    from vllm.v1.sample.sampler import Sampler

    from specdec_plugin.device import get_device, select_device_name
    from specdec_plugin.spec_decode import rejection_sampler as rs

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", default="32000,128256")
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--k", default="2,4")
    p.add_argument("--blocks", type=int, default=9)
    p.add_argument("--calls", type=int, default=20, help="calls per block")
    p.add_argument("--json")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    layer = get_device(select_device_name())
    sampler = rs.SpecDecRejectionSampler(Sampler(), providers=layer.kernel_providers)
    timed = _timer(device)
    rows = []
    print(f"{'vocab':>7} {'batch':>5} {'k':>2} {'general us':>11} {'greedy us':>10} {'greedy/general':>15}")
    with torch.inference_mode():
        for vocab in (int(v) for v in args.vocab.split(",")):
            for batch in (int(b) for b in args.batches.split(",")):
                for k in (int(x) for x in args.k.split(",")):
                    meta, logits, sm = _inputs(batch, k, vocab, device, dtype)
                    call = lambda: sampler(meta, None, logits, sm)  # noqa: E731
                    # The general path: argmax_decides patched for the whole block, outside the
                    # timed calls.
                    paths = {"greedy": lambda: contextlib.nullcontext(),
                             "general": lambda: mock.patch.object(rs, "argmax_decides",
                                                                  lambda _: False)}
                    tokens = {}
                    for name, path in paths.items():
                        with path():
                            tokens[name] = call().sampled_token_ids
                    same = torch.equal(tokens["greedy"], tokens["general"])
                    times = {"general": [], "greedy": []}
                    for block in range(args.blocks):
                        order = ("general", "greedy") if block % 2 == 0 else ("greedy", "general")
                        for name in order:
                            with paths[name]():
                                call()  # warm
                                times[name].append(statistics.median(
                                    timed(call)[0] for _ in range(args.calls)))
                    g, f = statistics.median(times["general"]), statistics.median(times["greedy"])
                    rows.append({"vocab": vocab, "batch": batch, "k": k, "general_us": g,
                                 "greedy_us": f, "ratio": f / g, "same_tokens": same})
                    print(f"{vocab:>7} {batch:>5} {k:>2} {g:>11.1f} {f:>10.1f} {f / g:>15.3f}"
                          + ("" if same else "  TOKENS DIFFER"), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"device": str(device), "dtype": str(dtype), "providers": list(layer.kernel_providers),
                       "blocks": args.blocks, "calls": args.calls, "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
