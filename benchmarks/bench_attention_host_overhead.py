"""Host time of one attention layer call on the CPU: this checkout against an older commit.

An eager (piecewise) step pays, in every layer, ``SpecDecAttentionImpl.do_kv_cache_update``
and ``.forward``: the KV-cache views, the contract checks of both kernels, then the kernels.
With tiny tensors (4 requests x 1 token, 4 query / 2 KV heads of 64, fp32) the kernels' own
work is small, so what differs between the two versions is host overhead. Both versions run
in one process on the same inputs, in interleaved rounds (old then new, new then old, ...).
A round times ``--steps`` steps of ``--layers`` layers (new q/k/v/out views per layer, like
vLLM's custom op; one kv_cache tensor and one impl per layer); the report is the median round,
with the median of the per-round old - new differences.

The old version is the files on the attention path as they are at ``--old-ref`` (``git show``):
attention/impl.py, ops/contract.py, both validators and the torch and C++ providers of
paged_attention and reshape_and_cache, executed as private modules, so the product has no A/B
switch. Everything else (vLLM, the C++ extension) is shared. Before timing, both versions run
the same step and their outputs and caches are compared for equality.

Runs under ``torch.inference_mode()`` like vLLM's model runner (inference tensors have no
version counter, so the CPU providers' index-value checks run on every call in both versions);
``--no-inference-mode`` lets those be memoised per step instead.

    PYTHONPATH=. python benchmarks/bench_attention_host_overhead.py [--providers torch cpp]
        [--old-ref REF] [--layers 60] [--steps 20] [--rounds 15]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
PKG = "specdec_plugin"
# Dependency order: each file's specdec_plugin imports resolve to the old modules before it.
OLD_FILES = (
    "ops/contract.py",
    "ops/paged_attention/validate.py",
    "ops/reshape_and_cache/validate.py",
    "ops/paged_attention/reference.py",
    "ops/reshape_and_cache/reference.py",
    "ops/paged_attention/cpp.py",
    "ops/reshape_and_cache/cpp.py",
    "attention/impl.py",
)
NUM_REQS, HQ, HKV, HEAD, BLOCK, CONTEXT = 4, 4, 2, 64, 16, 20


def _module_name(path: str) -> str:
    return f"{PKG}.{path[:-3].replace('/', '.')}"


def load_old(ref: str) -> dict[str, types.ModuleType]:
    """The OLD_FILES as they are at ``ref``, executed as private modules whose specdec_plugin
    imports of one another resolve to the old copies (sys.modules is patched only while each
    file executes)."""
    old: dict[str, types.ModuleType] = {}
    for path in OLD_FILES:
        name = _module_name(path)
        source = subprocess.check_output(["git", "show", f"{ref}:{PKG}/{path}"], cwd=REPO)
        module = types.ModuleType(f"_old_{name}")
        module.__file__ = f"{ref}:{PKG}/{path}"
        with _modules_replaced(old):
            exec(compile(source, module.__file__, "exec"), module.__dict__)
        old[name] = module
    return old


@contextlib.contextmanager
def _modules_replaced(replacement: dict[str, types.ModuleType]):
    import importlib

    for name in replacement:  # the real ones first, so their parents are set up
        importlib.import_module(name)
    saved = {name: sys.modules[name] for name in replacement}
    sys.modules.update(replacement)
    try:
        yield
    finally:
        sys.modules.update(saved)


def impl_class(old: dict[str, types.ModuleType] | None, provider: str):
    """SpecDecAttentionImpl bound to ``provider``: this checkout's or the old one, the latter
    with its kernels from the old provider modules."""
    if old is None:
        from specdec_plugin.attention.impl import SpecDecAttentionImpl as base
    else:
        module = old[f"{PKG}.attention.impl"]
        base = module.SpecDecAttentionImpl
        kernels = {
            "paged_attention": old[f"{PKG}.ops.paged_attention.{_file(provider)}"].paged_attention,
            "reshape_and_cache":
                old[f"{PKG}.ops.reshape_and_cache.{_file(provider)}"].reshape_and_cache,
        }
        module.get_kernel = lambda op, providers: kernels[op]
    return type(base.__name__, (base,), {"kernel_providers": (provider,)})


def _file(provider: str) -> str:
    return {"torch": "reference", "cpp": "cpp"}[provider]


def make_model(impl_cls, num_layers: int, seed: int = 0):
    """One impl and one [2, blocks, block, kv_heads, head] cache per layer, a packed qkv
    buffer per layer and one step's metadata (decode: 1 token per request)."""
    from specdec_plugin.attention.metadata import SpecDecAttentionMetadata

    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = (CONTEXT + BLOCK - 1) // BLOCK
    num_blocks = NUM_REQS * blocks_per_seq + 4
    impls = [impl_cls(HQ, HEAD, HEAD ** -0.5, HKV) for _ in range(num_layers)]
    caches = [torch.randn(2, num_blocks, BLOCK, HKV, HEAD, generator=g) for _ in impls]
    qkv = [torch.randn(NUM_REQS, (HQ + 2 * HKV) * HEAD, generator=g) for _ in impls]
    table = torch.randperm(num_blocks, generator=g)[: NUM_REQS * blocks_per_seq]
    table = table.view(NUM_REQS, blocks_per_seq).to(torch.int32)
    slots = (table[:, (CONTEXT - 1) // BLOCK].long() * BLOCK + (CONTEXT - 1) % BLOCK)
    meta = SpecDecAttentionMetadata(
        num_actual_tokens=NUM_REQS, max_query_len=1, max_seq_len=CONTEXT,
        query_start_loc=torch.arange(NUM_REQS + 1, dtype=torch.int32),
        seq_lens=torch.full((NUM_REQS,), CONTEXT, dtype=torch.int32), block_table=table,
        slot_mapping=slots)
    outs = [torch.empty(NUM_REQS, HQ * HEAD) for _ in impls]
    return impls, caches, qkv, meta, outs


def step(model) -> None:
    """One eager step: every layer writes its new K/V and attends, through fresh views of its
    qkv and output buffers (vLLM's custom op receives new tensor objects each layer)."""
    impls, caches, qkv, meta, outs = model
    for impl, kv_cache, buf, out in zip(impls, caches, qkv, outs):
        q = buf[:, : HQ * HEAD].view(NUM_REQS, HQ, HEAD)
        k = buf[:, HQ * HEAD: (HQ + HKV) * HEAD].view(NUM_REQS, HKV, HEAD)
        v = buf[:, (HQ + HKV) * HEAD:].view(NUM_REQS, HKV, HEAD)
        impl.do_kv_cache_update(None, k, v, kv_cache, meta.slot_mapping)
        impl.forward(None, q, k, v, kv_cache, meta, out.view(NUM_REQS, HQ, HEAD))


def _round_us(model, steps: int) -> float:
    layers = len(model[0])
    start = time.perf_counter()
    for _ in range(steps):
        step(model)
    return (time.perf_counter() - start) / (steps * layers) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--providers", nargs="+", default=["torch", "cpp"],
                        choices=["torch", "cpp"])
    parser.add_argument("--old-ref", default=None,
                        help="default: where this branch left main (git merge-base HEAD main)")
    parser.add_argument("--layers", type=int, default=60)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--no-inference-mode", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.old_ref is None:
        args.old_ref = subprocess.check_output(["git", "merge-base", "HEAD", "main"], cwd=REPO,
                                               text=True).strip()
    old = load_old(args.old_ref)
    mode = contextlib.nullcontext() if args.no_inference_mode else torch.inference_mode()
    print(f"old: {args.old_ref} ({_rev(args.old_ref)}), new: working tree ({_rev('HEAD')}+); "
          f"{args.layers} layers, {NUM_REQS} requests x 1 token, {HQ}/{HKV} heads of {HEAD}, "
          f"context {CONTEXT}; inference_mode={not args.no_inference_mode}, "
          f"threads={args.threads}; median of {args.rounds} interleaved rounds of "
          f"{args.steps} steps")
    with mode:
        for provider in args.providers:
            models = {"old": make_model(impl_class(old, provider), args.layers),
                      "new": make_model(impl_class(None, provider), args.layers)}
            for model in models.values():  # warm up, and the same step must give the same
                step(model)                # caches and outputs
            for a, b in zip(models["old"][1] + models["old"][4],
                            models["new"][1] + models["new"][4]):
                assert torch.equal(a, b), "old and new results differ"
            times: dict[str, list[float]] = {"old": [], "new": []}
            for i in range(args.rounds):
                # Alternate which goes first, so a drift in machine load favours neither.
                for name in ("old", "new") if i % 2 == 0 else ("new", "old"):
                    times[name].append(_round_us(models[name], args.steps))
            med = {name: statistics.median(t) for name, t in times.items()}
            spread = {name: (min(t), max(t)) for name, t in times.items()}
            # Each round's old and new ran back to back: the median of their differences is
            # less exposed to load that changes between rounds than a difference of medians.
            paired = statistics.median(o - n for o, n in zip(times["old"], times["new"]))
            print(f"{provider:6s} old {med['old']:7.2f} us/layer "
                  f"[{spread['old'][0]:.2f}..{spread['old'][1]:.2f}]  "
                  f"new {med['new']:7.2f} us/layer "
                  f"[{spread['new'][0]:.2f}..{spread['new'][1]:.2f}]  "
                  f"new/old {med['new'] / med['old']:.3f}  "
                  f"saved (median of paired rounds) {paired:5.2f} us/layer")


def _rev(ref: str) -> str:
    return subprocess.check_output(["git", "rev-parse", "--short", ref], cwd=REPO,
                                   text=True).strip()


if __name__ == "__main__":
    main()
