"""Stage gen: SmolLM2 answers many prompts through vLLM on our platform; token shards out.

    python -m training.stage_gen --data /root/specdec_data --deadline-s 540

The target runs in vLLM's ``LLM`` engine, which picks up our platform plugin (CUDA on the
GPU machine, CPU here): requests stream into the engine (``LLMEngine.add_request`` / ``step``)
so that a batch of ``--max-num-seqs`` stays full until the deadline, when the requests still
running are aborted (their partial answers are dropped) and the last shard is written.

Per prompt: one greedy answer, plus ``--chat-samples`` (chat) or ``--other-samples`` (the rest)
answers sampled at T=0.7. Held-out prompts (``prompt_sources.is_heldout``) are never trained
on: ``--heldout-count`` of them are answered greedily first into ``heldout.npz`` (agreement
measured by the training stage). Training jobs are interleaved by ``SHARES`` so that any
prefix of the work is a mix of every category. ``gen_summary.json`` records the sizes and the
generation throughput (generated tokens per second of engine time).

``--replicas N`` runs N engines side by side on one device, each in its own process with its
share of the jobs (``--replica i/N``, every N-th job): a 135M target leaves an H100 mostly
idle, and one engine's host loop (scheduling hundreds of sequences a step) is the limit, not
the GPU. Replica 0 answers the held-out prompts; replica i writes ``train-r<i>-*.npz`` and
``gen_summary-r<i>.json``, merged into ``gen_summary.json`` when all have finished.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from training.prompt_sources import CATEGORIES, build_all, is_heldout, stable_hash
from training.shards import HELDOUT_NAME, ShardWriter

T0 = time.time()
END_TOKENS = [2, 0]  # <|im_end|>, <|endoftext|>
# Share of training sequences per category while every category still has work left.
SHARES = {"chat": 0.4, "code": 0.25, "code_chat": 0.2, "prose": 0.15}


_TAG = ""  # " r<i>" in a replica's lines


def log(message: str) -> None:
    print(f"[gen{_TAG} {time.time() - T0:6.1f}s] {message}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--model", type=Path, help="target checkpoint (default: fetch_smollm2())")
    p.add_argument("--data", type=Path, required=True, help="where the shards go")
    p.add_argument("--deadline-s", type=float, default=540.0, help="whole stage, from start")
    p.add_argument("--stop-margin-s", type=float, default=8.0, help="kept for the last shard")
    p.add_argument("--max-files", type=int, default=8000, help="python files sampled for prompts")
    p.add_argument("--prompt-budget-s", type=float, default=40.0)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--humaneval", type=Path)
    p.add_argument("--limit-prompts", type=int, help="smoke runs: this many training prompts")
    p.add_argument("--heldout-count", type=int, default=256)
    p.add_argument("--chat-samples", type=int, default=3)
    p.add_argument("--other-samples", type=int, default=1)
    p.add_argument("--chat-share", type=float, default=SHARES["chat"],
                   help="share of training jobs that are chat (the rest keep their ratios)")
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument("--max-prompt", type=int, default=768)
    p.add_argument("--max-num-seqs", type=int, default=512)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--dtype", default="auto", help="auto: bfloat16 on a GPU, float32 on CPU")
    p.add_argument("--shard-tokens", type=int, default=1_000_000)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--allow-native", action="store_true", help="run on vLLM's own platform too")
    p.add_argument("--replicas", type=int, default=1, help="engines side by side (see above)")
    p.add_argument("--replica", default="0/1", help="i/N: this process's share (set by --replicas)")
    p.add_argument("--kv-cache-gib", type=float,
                   help="KV cache per engine (vLLM's kv_cache_memory_bytes); replicas need it, "
                        "since engines that profile memory side by side see each other's use")
    args = p.parse_args(argv)
    index, count = (int(x) for x in args.replica.split("/"))
    if not 0 <= index < count:
        p.error(f"--replica {args.replica}: want i/N with 0 <= i < N")
    args.replica_index, args.replica_count = index, count
    try:
        args.shares = shares_with_chat(args.chat_share)
    except ValueError as e:
        p.error(str(e))
    if args.replicas < 1 or (args.replicas > 1 and args.kv_cache_gib is None):
        p.error("--replicas N needs N >= 1, and --kv-cache-gib when N > 1")
    return args


def render(prompts, tokenizer, max_prompt: int) -> list[dict]:
    """Token ids per prompt; chat prompts in SmolLM2's template (half with its default system
    prompt, half bare, as the GPU test prompts are written); too-long prompts dropped."""
    texts = []
    for p in prompts:
        if not p["chat"]:
            texts.append(p["text"])
        elif stable_hash(p["name"]) % 2:
            texts.append(tokenizer.apply_chat_template([{"role": "user", "content": p["text"]}],
                                                       tokenize=False, add_generation_prompt=True))
        else:
            texts.append(f"<|im_start|>user\n{p['text']}<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [dict(p, ids=i) for p, i in zip(prompts, ids) if 0 < len(i) <= max_prompt]


def shares_with_chat(chat_share: float) -> dict[str, float]:
    """SHARES with chat set to ``chat_share`` and the other categories scaled to the rest."""
    if not 0.0 < chat_share < 1.0:
        raise ValueError(f"--chat-share {chat_share}: want a share strictly between 0 and 1")
    rest = 1.0 - SHARES["chat"]
    return {c: chat_share if c == "chat" else s * (1.0 - chat_share) / rest
            for c, s in SHARES.items()}


def training_jobs(prompts, chat_samples: int, other_samples: int,
                  shares: dict[str, float] = SHARES) -> list[tuple[dict, bool]]:
    """(prompt, greedy) jobs, interleaved by shares: job j of a category is placed at j/share."""
    keyed = []
    for cat in CATEGORIES:
        jobs = []
        for p in (p for p in prompts if p["category"] == cat):
            n = chat_samples if cat == "chat" else other_samples
            jobs += [(p, True)] + [(p, False)] * n
        keyed += [(j / shares[cat], cat, job) for j, job in enumerate(jobs)]
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [job for _, _, job in keyed]


def heldout_jobs(prompts, count: int) -> list[tuple[dict, bool]]:
    by_cat = {c: [p for p in prompts if p["category"] == c] for c in CATEGORIES}
    out, i = [], 0
    while len(out) < count and any(i < len(v) for v in by_cat.values()):
        out += [(v[i], True) for v in by_cat.values() if i < len(v)]
        i += 1
    return out[:count]


def run_jobs(llm, jobs, writer: ShardWriter, args, stop_at: float, shard_tokens: int) -> dict:
    """Stream ``jobs`` through the engine until done or ``stop_at``; write what finishes."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    # Token ids only, once per request: no detokenizing and no cumulative outputs every step
    # (both cost the engine's front end time per step at a batch of hundreds).
    common = dict(max_tokens=args.max_new, stop_token_ids=END_TOKENS, detokenize=False,
                  output_kind=RequestOutputKind.FINAL_ONLY)
    greedy_params = SamplingParams(temperature=0.0, **common)
    sampled_params = SamplingParams(temperature=0.7, top_p=1.0, **common)
    in_flight, next_job, gen_tokens, finished = {}, 0, 0, 0
    window = 2 * args.max_num_seqs
    t_start = time.time()
    last_log = t_start
    aborted = 0
    while True:
        now = time.time()
        if now >= stop_at:
            aborted = len(in_flight)
            if in_flight:
                engine.abort_request(list(in_flight))
            break
        while len(in_flight) < window and next_job < len(jobs):
            prompt, greedy = jobs[next_job]
            rid = f"j{next_job}"
            engine.add_request(rid, {"prompt_token_ids": prompt["ids"]},
                               greedy_params if greedy else sampled_params)
            in_flight[rid] = jobs[next_job]
            next_job += 1
        if not in_flight:
            break
        for out in engine.step():
            if not out.finished:
                continue
            prompt, greedy = in_flight.pop(out.request_id)
            answer = list(out.outputs[0].token_ids)
            writer.add(prompt["ids"] + answer, len(prompt["ids"]), greedy,
                       CATEGORIES.index(prompt["category"]))
            gen_tokens += len(answer)
            finished += 1
        if writer.pending_tokens >= shard_tokens:
            writer.flush()
        if time.time() - last_log > 20:
            last_log = time.time()
            rate = gen_tokens / (last_log - t_start)
            log(f"  {finished} done, {len(in_flight)} running, {gen_tokens} generated tokens, "
                f"{rate:.0f} tok/s")
    wall = time.time() - t_start
    return {"jobs_total": len(jobs), "jobs_started": next_job, "finished": finished,
            "aborted_at_deadline": aborted, "generated_tokens": gen_tokens,
            "wall_s": round(wall, 1), "generated_tokens_per_s": round(gen_tokens / max(wall, 1e-9), 1)}


def merge_summaries(parts: list[dict]) -> dict:
    """One summary for replicas that ran side by side: counts add up; the rate is all generated
    tokens over the longest replica's generation time (they overlap, so not the sum of times)."""
    gen = sum(p["train"]["generated_tokens"] for p in parts)
    wall = max(p["train"]["wall_s"] for p in parts)
    merged = dict(parts[0])
    merged["replicas"] = parts
    merged["heldout"] = next((p["heldout"] for p in parts if p["heldout"]), None)
    merged["train"] = {key: sum(p["train"][key] for p in parts)
                       for key in ("jobs_total", "jobs_started", "finished", "aborted_at_deadline",
                                   "generated_tokens")}
    merged["train"].update(wall_s=wall, generated_tokens_per_s=round(gen / max(wall, 1e-9), 1))
    merged["train_shards"] = {key: sum(p["train_shards"][key] for p in parts)
                              for key in ("sequences", "tokens")}
    return merged


def run_replicas(args, argv) -> int:
    """Start ``args.replicas`` copies of this stage, each on its share, and merge their summaries."""
    argv = list(sys.argv[1:] if argv is None else argv)
    children = []
    for i in range(args.replicas):
        child_argv = argv + ["--replicas", "1", "--replica", f"{i}/{args.replicas}",
                             "--workers", str(max(1, args.workers // args.replicas)),
                             "--gpu-memory-utilization",
                             str(round(args.gpu_memory_utilization / args.replicas, 3))]
        env = dict(os.environ)
        # Each engine compiles into its own cache: no two writers of one cache entry.
        env["VLLM_CACHE_ROOT"] = os.path.join(env.get("VLLM_CACHE_ROOT", os.path.expanduser(
            "~/.cache/vllm")), f"replica{i}")
        children.append(subprocess.Popen([sys.executable, "-m", "training.stage_gen", *child_argv],
                                         env=env))
        log(f"replica {i}/{args.replicas} started (pid {children[-1].pid})")
    codes = [c.wait() for c in children]
    log(f"replicas finished: exit codes {codes}")
    parts = [json.loads(p.read_text()) for p in sorted(args.data.glob("gen_summary-r*.json"))]
    if not parts:
        return 1
    merged = merge_summaries(parts)
    merged["total_s"] = round(time.time() - T0, 1)
    (args.data / "gen_summary.json").write_text(json.dumps(merged, indent=1))
    log(f"done: {merged['train_shards']} from {len(parts)} engines in {merged['total_s']}s, "
        f"{merged['train']['generated_tokens_per_s']} generated tok/s together")
    return 0 if all(c == 0 for c in codes) else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    if args.replicas > 1:
        return run_replicas(args, argv)
    if args.replica_count > 1:
        global _TAG
        _TAG = f" r{args.replica_index}"
    import torch
    from transformers import AutoTokenizer

    model = args.model
    if model is None:
        from specdec_plugin.models import fetch_smollm2

        model = fetch_smollm2()
    cuda = torch.cuda.is_available()
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if cuda else "float32")
    # Prompts first: the worker processes fork before any tokenizer thread pool exists.
    prompts = build_all(args.max_files, args.humaneval, workers=args.workers,
                        budget_s=args.prompt_budget_s, log=log)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    prompts = render(prompts, tokenizer, args.max_prompt)
    held = [p for p in prompts if is_heldout(p["name"])]
    train = [p for p in prompts if not is_heldout(p["name"])]
    if args.limit_prompts:
        train = train[: args.limit_prompts]
    jobs = training_jobs(train, args.chat_samples, args.other_samples, args.shares)
    jobs = jobs[args.replica_index::args.replica_count]
    hjobs = heldout_jobs(held, args.heldout_count) if args.replica_index == 0 else []
    log(f"{len(train)} training prompts -> {len(jobs)} jobs; {len(held)} held out "
        f"({len(hjobs)} answered for evaluation)")

    from vllm import LLM
    from vllm.platforms import current_platform

    t_engine = time.time()
    engine_kwargs = dict(dtype=dtype, max_model_len=args.max_prompt + args.max_new + 8, seed=0,
                         max_num_seqs=args.max_num_seqs,
                         max_num_batched_tokens=args.max_num_batched_tokens,
                         enable_prefix_caching=True, enforce_eager=args.enforce_eager)
    if cuda:
        engine_kwargs["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.kv_cache_gib is not None:
        engine_kwargs["kv_cache_memory_bytes"] = int(args.kv_cache_gib * (1 << 30))
    llm = LLM(model=str(model), **engine_kwargs)
    engine_start = time.time() - t_engine
    if not type(current_platform).__module__.startswith("specdec_plugin") and not args.allow_native:
        raise SystemExit(f"vLLM runs on {type(current_platform).__name__}, not our plugin's "
                         "platform: install the plugin (pip install -e .) or pass --allow-native")
    log(f"engine up in {engine_start:.1f}s on {type(current_platform).__name__} ({dtype})")

    stop_at = T0 + args.deadline_s - args.stop_margin_s
    held_stats = None
    if hjobs:
        held_writer = ShardWriter(args.data, prefix="heldout")
        held_stats = run_jobs(llm, hjobs, held_writer, args, stop_at, shard_tokens=1 << 62)
        held_writer.flush(HELDOUT_NAME)
        log(f"held-out answers: {held_stats}")
    prefix = "train" if args.replica_count == 1 else f"train-r{args.replica_index}"
    writer = ShardWriter(args.data, prefix=prefix)
    stats = run_jobs(llm, jobs, writer, args, stop_at, args.shard_tokens)
    writer.flush()
    log(f"training answers: {stats}")

    summary = {
        "platform": type(current_platform).__name__, "device": torch.cuda.get_device_name() if cuda else "cpu",
        "dtype": dtype, "model": str(model), "engine": {k: v for k, v in engine_kwargs.items()},
        "engine_start_s": round(engine_start, 1),
        "prompts": {"training": len(train), "heldout": len(held),
                    "by_category": {c: sum(p["category"] == c for p in train) for c in CATEGORIES}},
        "heldout": held_stats, "train": stats,
        "train_shards": {"sequences": writer.written_sequences, "tokens": writer.written_tokens},
        "total_s": round(time.time() - T0, 1),
    }
    name = "gen_summary.json" if args.replica_count == 1 else f"gen_summary-r{args.replica_index}.json"
    (args.data / name).write_text(json.dumps(summary, indent=1))
    log(f"done: {summary['train_shards']} in {summary['total_s']}s, "
        f"{stats['generated_tokens_per_s']} generated tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
