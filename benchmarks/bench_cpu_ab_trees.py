"""Before/after A/B of adaptive drafting on the CPU: several source trees in one run.

Each config runs in its own process, one engine at a time, with ``PYTHONPATH`` set to its tree
(a git worktree at the commit to compare, with the built ``specdec_plugin/_C*.so`` copied in),
on bench_cpu_side_by_side.py's workloads and engine settings: 8 chat and 8 code prompts, batch
1 (each prompt in turn) and batch 8, 64 greedy tokens, tokens/s of the whole call. Prints each
cell's ratio to the first config and whether its tokens equal the first config's.

    python benchmarks/bench_cpu_ab_trees.py OUT.json CONFIGS.json
    # CONFIGS.json: [{"name": "none", "tree": "/work/wt-base", "method": "none"},
    #                {"name": "dm-before", "tree": "/work/wt-base", "method": "draft_model"},
    #                {"name": "dm-after", "tree": "/work/wt-new", "method": "draft_model"}]
    # optional per config: "env" (extra environment), "engine" (extra LLM arguments),
    #   "workloads" (default ["code", "chat"]), "batches" (default [1, 8]), "min_tokens": false
    #   (no min_tokens floor)

On 2 cores the same engine varies by 5-13% from one start to the next (issue 11, 2026-11-25):
alternate the configs over several rounds and compare means."""
import json, os, subprocess, sys, time

MAX_TOKENS = 64
PY = sys.executable


def _own_workloads(tok):
    """The prompts of this script's own tree (bench_cpu_side_by_side.tokenized_workloads), so
    every compared tree, older ones included, gets the same ones."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_cpu_side_by_side.py")
    spec = importlib.util.spec_from_file_location("_ab_side_by_side", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tokenized_workloads(tok)


def child(cfg):
    sys.path.insert(0, os.path.join(cfg["tree"], "benchmarks"))
    from bench_spec_cpu import spec_configs
    from transformers import AutoTokenizer
    from specdec_plugin.models import fetch_smollm2
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    sys.path.insert(0, os.path.join(cfg["tree"], "tests"))
    from engine_runner import _spec_counters, _delta

    model = str(fetch_smollm2())
    tok = AutoTokenizer.from_pretrained(model)
    workloads = _own_workloads(tok)
    target, spec = spec_configs(model)[cfg["method"]]
    args = dict(dtype="float32", enforce_eager=False, max_model_len=2048, enable_prefix_caching=False,
                max_num_seqs=8, seed=0, disable_log_stats=False, speculative_config=spec)
    args.update(cfg.get("engine", {}))
    t0 = time.perf_counter()
    llm = LLM(model=target, **args)
    out = {"start_s": time.perf_counter() - t0}
    # min_tokens as long as the answer by default (as the side-by-side benchmark); "min_tokens":
    # false in a config leaves it out, as most requests do (it keeps a logits processor active,
    # which takes the rejection sampler off its greedy path).
    floor = cfg.get("min_tokens", True)
    gen = lambda b, n=MAX_TOKENS: [list(o.outputs[0].token_ids) for o in llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in b],
        SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n if floor else 0,
                       ignore_eos=True), use_tqdm=False)]
    for wl in cfg.get("workloads", ["code", "chat"]):
        prompts = workloads[wl]
        for b in cfg.get("batches", (1, 8)):
            gen([prompts[0]] if b == 1 else prompts, 4)
            c0 = _spec_counters(llm) if spec else None
            t = time.perf_counter()
            outs = [gen([p])[0] for p in prompts] if b == 1 else gen(prompts)
            dt = time.perf_counter() - t
            e = {"tok_s": len(prompts) * MAX_TOKENS / dt, "outs": outs}
            if spec:
                e["spec"] = _delta(_spec_counters(llm), c0)
            out[f"{wl}/b{b}"] = e
            print(f"  {cfg['name']} {wl}/b{b}: {e['tok_s']:.1f} tok/s {e.get('spec', '')}", file=sys.stderr, flush=True)
    llm.llm_engine.engine_core.shutdown()
    print("RESULT " + json.dumps(out), flush=True)


def main():
    out_path, configs = sys.argv[1], json.loads(open(sys.argv[2]).read())
    results = {"loadavg_before": open("/proc/loadavg").read().strip(), "date": time.strftime("%F %T %Z")}
    for cfg in configs:
        env = dict(os.environ, PYTHONPATH=cfg["tree"], OMP_WAIT_POLICY="PASSIVE", **cfg.get("env", {}))
        p = subprocess.run([PY, __file__, "--child", json.dumps(cfg)], env=env, capture_output=True, text=True)
        with open(out_path + ".log", "a") as f:
            f.write(f"===== {cfg}\n{p.stdout[-30000:]}{p.stderr[-60000:]}")
        res = next((json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")), {"error": p.stderr[-2000:]})
        results[cfg["name"]] = res
        print(cfg["name"], {k: round(v["tok_s"], 1) for k, v in res.items() if isinstance(v, dict) and "tok_s" in v}, flush=True)
    results["loadavg_after"] = open("/proc/loadavg").read().strip()
    base = results.get(configs[0]["name"], {})
    for cfg in configs:
        r = results[cfg["name"]]
        for key, v in list(r.items()):
            if isinstance(v, dict) and "outs" in v:
                v["greedy_equal_first"] = v["outs"] == base.get(key, {}).get("outs")
        line = "  ".join(f"{k} {v['tok_s']:6.1f} ({v['tok_s'] / base[k]['tok_s']:.2f}x, eq={v['greedy_equal_first']})"
                         for k, v in r.items() if isinstance(v, dict) and "tok_s" in v and k in base)
        print(f"{cfg['name']:24s} {line}")
    for r in results.values():
        if isinstance(r, dict):
            for v in r.values():
                if isinstance(v, dict):
                    v.pop("outs", None)
    json.dump(results, open(out_path, "w"), indent=1)
    print(results["loadavg_before"], "->", results["loadavg_after"])


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
    else:
        main()
