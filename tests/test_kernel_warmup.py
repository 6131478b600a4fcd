"""worker/kernel_warmup.py: at engine start every attention kernel variant serving launches
(query tile 1, verification tile, largest tile; split and unsplit) is launched once. Runs the
Triton kernel under its interpreter here (tests/conftest.py), with an H100's SM count so the
split heuristic plans as it would there."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specdec_plugin.attention.impl import SpecDecAttentionImpl
from specdec_plugin.ops.registry import get_kernel
from specdec_plugin.worker.kernel_warmup import compile_attention_variants

HQ, HKV, HEAD, BLOCK, BLOCKS = 8, 2, 32, 16, 8  # 128 positions: the largest ungrouped tile


def _runner(kv_cache: torch.Tensor, layers: int = 2, heads: tuple[int, int] = (HQ, HKV)):
    def layer():
        impl = SpecDecAttentionImpl(heads[0], HEAD, HEAD ** -0.5, heads[1])
        impl._attention = get_kernel("paged_attention", ("triton",))
        return SimpleNamespace(impl=impl, kv_cache=kv_cache, dtype=torch.float32)

    context = {f"model.layers.{i}.attn": layer() for i in range(layers)}
    context["not_attention"] = SimpleNamespace(weight=torch.zeros(1))
    return SimpleNamespace(compilation_config=SimpleNamespace(static_forward_context=context),
                           model_config=SimpleNamespace(max_model_len=BLOCK * BLOCKS,
                                                        dtype=torch.float32))


# (query heads, KV heads): grouped like SmolLM2's 9/3 and the 8/2 default, and ungrouped like
# the GPU tests' draft model (3/3), whose largest tile is a 128-token query: planned as an
# ordinary launch over so few KV heads it splits, which once left its unsplit variant to compile
# at the first prefill on the H100 (session 26).
@pytest.mark.parametrize("heads", [(HQ, HKV), (9, 3), (3, 3)])
def test_every_tile_class_is_launched_split_and_unsplit(monkeypatch, heads):
    from specdec_plugin.ops.paged_attention import triton as kernels
    from tests.ops.providers import small_shape_device

    device = small_shape_device()
    monkeypatch.setattr(kernels, "_device_index", lambda device: 0)
    monkeypatch.setattr(kernels, "_sm_count", lambda device_index: 132)
    plans = []
    launch_plan = kernels._launch_plan
    monkeypatch.setattr(kernels, "_launch_plan",
                        lambda *args: plans.append(launch_plan(*args)) or plans[-1])
    kv_cache = torch.rand(2, BLOCKS, BLOCK, heads[1], HEAD, device=device) + 0.5
    before = kv_cache.clone()

    launches = compile_attention_variants(_runner(kv_cache, heads=heads))

    group_pad = 1 << (heads[0] // heads[1] - 1).bit_length()
    largest = 128 // group_pad  # rows per tile over a (padded) group of query heads
    assert kernels.variant_query_lengths(*heads) == (1, 2, largest)
    assert launches == 6  # one layer shape (the second layer is the same): 3 tiles x 2
    assert {(p.block_q, p.num_splits > 1) for p in plans} == {
        (b, split) for b in (1, min(8, largest), largest) for split in (False, True)}
    assert torch.equal(kv_cache, before)  # reads the cache, writes nothing to it


def test_fused_kv_write_layers_launch_their_variants_too(monkeypatch):
    """SPECDEC_FUSED_KV_WRITE: the fused kernel is a variant of its own (WRITE_KV), so each
    tile class is launched with it as well, over slots that are all padding: nothing is
    written."""
    from specdec_plugin.ops.paged_attention import triton as kernels
    from tests.ops.providers import small_shape_device

    device = small_shape_device()
    monkeypatch.setattr(kernels, "_device_index", lambda device: 0)
    monkeypatch.setattr(kernels, "_sm_count", lambda device_index: 132)
    kv_cache = torch.rand(2, BLOCKS, BLOCK, HKV, HEAD, device=device) + 0.5
    before = kv_cache.clone()
    runner = _runner(kv_cache)
    fused = []
    for layer in runner.compilation_config.static_forward_context.values():
        if hasattr(layer, "impl"):
            layer.impl.writes_kv_in_forward = True
            layer.impl._attention_write_kv = get_kernel("paged_attention_write_kv", ("triton",))
    real = kernels.paged_attention_splits
    monkeypatch.setattr(kernels, "paged_attention_splits",
                        lambda *a, **k: fused.append(k.get("new_kv") is not None) or real(*a, **k))

    assert compile_attention_variants(runner) == 12  # 3 tiles x split or not x fused or not
    assert sum(fused) == 6
    assert torch.equal(kv_cache, before)


def test_layers_without_our_attention_or_cache_are_skipped():
    runner = _runner(torch.tensor([]))  # before the KV cache is bound
    assert compile_attention_variants(runner) == 0


# ---- compile_spec_decode_kernels: the speculative step's kernels ----

class _Spy:
    """Stands in for a Triton kernel: records each launch's arguments, then launches."""

    def __init__(self, kernel, calls: list):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        def launch(*args, **constexprs):
            self.calls.append((args, constexprs))
            return self.kernel[grid](*args, **constexprs)
        return launch


def _dtypes(args) -> list:
    return [a.dtype for a in args if isinstance(a, torch.Tensor)]


def _spec_runner(device, k, drafter=True, rates=None):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        device_layer=SimpleNamespace(kernel_providers=("triton", "torch")), device=device,
        model_config=SimpleNamespace(get_vocab_size=lambda: 96, max_model_len=2048),
        cache_config=SimpleNamespace(block_size=16),
        input_batch=SimpleNamespace(block_table=[SimpleNamespace(max_num_blocks_per_req=128)]),
        rejection_sampler=SimpleNamespace(synthetic_conditional_rates=rates),
        drafter=SimpleNamespace(prepare_next_token_ids_padded=object()) if drafter else None)


@pytest.mark.parametrize("synthetic", [False, True])
def test_spec_decode_kernels_launch_the_variants_served_steps_compiled(monkeypatch, synthetic):
    """The variants and argument dtypes are those vLLM's JIT monitor printed for the first
    request of EAGLE-family engines on the H100 (2026-11-25): all-greedy rejection
    (HAS_IS_GREEDY=False; SYNTHETIC=True in the benchmarks), next-token and input preparation
    on int32 / bool buffers."""
    from specdec_plugin.ops.rejection import triton as rejection
    from specdec_plugin.ops.spec_prep import triton as spec_prep
    from specdec_plugin.worker.kernel_warmup import compile_spec_decode_kernels
    from tests.ops.providers import small_shape_device

    device = small_shape_device()
    calls = {name: [] for name in ("greedy", "next", "prepare", "step")}
    monkeypatch.setattr(rejection, "_greedy_kernel", _Spy(rejection._greedy_kernel, calls["greedy"]))
    monkeypatch.setattr(spec_prep, "_next_token_padded_kernel",
                        _Spy(spec_prep._next_token_padded_kernel, calls["next"]))
    monkeypatch.setattr(spec_prep, "_prepare_inputs_padded_kernel",
                        _Spy(spec_prep._prepare_inputs_padded_kernel, calls["prepare"]))
    monkeypatch.setattr(spec_prep, "_eagle_step_kernel",
                        _Spy(spec_prep._eagle_step_kernel, calls["step"]))
    k = 4
    rates = torch.rand(k, device=device) if synthetic else None

    ops = compile_spec_decode_kernels(_spec_runner(device, k, rates=rates))

    assert ops == ["rejection_greedy_sample", "eagle_prepare_next_token_padded",
                   "eagle_prepare_inputs_padded", "eagle_step_slot_mapping_metadata"]
    assert len(calls["greedy"]) == k  # one per draft length 1..K
    for args, constexprs in calls["greedy"]:
        assert constexprs == {"HAS_IS_GREEDY": False, "SYNTHETIC": synthetic, "BLOCK": 16}
        out, _, cu, draft, argmax, bonus = args[:6]
        assert [t.dtype for t in (out, cu, draft, argmax, bonus)] == [
            torch.int32, torch.int32, torch.int32, torch.int64, torch.int32]
        if synthetic:
            assert [args[7].dtype, args[8].dtype] == [torch.float64, torch.float32]
    assert [c["BLOCK"] for _, c in calls["next"]] == [16] * (k + 1)  # 1 column, then 2..1+K
    for args, _ in calls["next"]:
        assert _dtypes(args) == [torch.int32, torch.bool, torch.int32, torch.int32, torch.int32]
        assert args[-1] == args[0].shape[1]  # num_cols: every column is read
    (args, constexprs), = calls["prepare"]
    assert constexprs == {"BLOCK": 128} and set(_dtypes(args)) == {torch.int32}
    # The drafter's step update, with the live call's classes: int64 positions and slots,
    # int32 sequence lengths and block table, the table as wide as the runner's rows.
    (args, _), = calls["step"]
    pos, table, stride, width, seq_lens, out_pos, out_slot = args[:7]
    assert [t.dtype for t in (pos, table, seq_lens, out_pos, out_slot)] == [
        torch.int64, torch.int32, torch.int32, torch.int64, torch.int64]
    assert stride == width == 128 and args[7:9] == (16, 2048)


def test_async_spec_decode_warms_the_computed_token_correction(monkeypatch):
    """Patch P14's kernel, with the live call's buffers (vLLM's runner: int32 counts, int64
    previous positions) and both element types of the previous batch's valid counts."""
    from specdec_plugin.ops.async_drift import triton as async_drift
    from specdec_plugin.worker.kernel_warmup import compile_spec_decode_kernels
    from tests.ops.providers import small_shape_device

    device = small_shape_device()
    calls = []
    monkeypatch.setattr(async_drift, "_correct_computed_tokens_kernel",
                        _Spy(async_drift._correct_computed_tokens_kernel, calls))
    runner = _spec_runner(device, 3)
    buffer = lambda dtype: SimpleNamespace(gpu=torch.zeros(8, dtype=dtype, device=device))  # noqa: E731
    runner.use_async_spec_decode = True
    runner.num_computed_tokens = torch.zeros(8, dtype=torch.int32, device=device)
    runner.num_accepted_tokens = buffer(torch.int32)
    runner.prev_positions = buffer(torch.int64)
    runner.prev_num_draft_tokens = buffer(torch.int32)

    ops = compile_spec_decode_kernels(runner)

    assert "correct_computed_tokens" in ops
    assert [_dtypes(args)[:6] for args, _ in calls] == [
        [torch.int32, torch.int32, torch.int64, valid, torch.int32, torch.int32]
        for valid in (torch.int32, torch.int64)]


def test_a_single_draft_token_needs_no_step_update(monkeypatch):
    from specdec_plugin.worker.kernel_warmup import compile_spec_decode_kernels
    from tests.ops.providers import small_shape_device

    ops = compile_spec_decode_kernels(_spec_runner(small_shape_device(), 1))
    assert "eagle_step_slot_mapping_metadata" not in ops  # K=1: vLLM drafts one token only


def test_spec_decode_kernels_without_a_padded_drafter_warm_only_the_sampler():
    from specdec_plugin.worker.kernel_warmup import compile_spec_decode_kernels
    from tests.ops.providers import small_shape_device

    device = small_shape_device()
    assert compile_spec_decode_kernels(_spec_runner(device, 3, drafter=False)) == [
        "rejection_greedy_sample"]  # n-gram and suffix
    none = SimpleNamespace(speculative_config=None)
    assert compile_spec_decode_kernels(none) == []  # no speculation


@pytest.mark.parametrize("with_drafter", [True, False])
def test_linear_variants_cover_the_target_and_the_drafter(monkeypatch, with_drafter):
    """``compile_linear_variants`` hands P16 the target model and, where there is one, the
    drafter (whose LM head may run outside any graph recorded at start-up), and names
    what was launched; with nothing launched (P16 off) it names nothing."""
    from specdec_plugin.patches import gpu_linear
    from specdec_plugin.worker.kernel_warmup import compile_linear_variants

    target = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 8))
    drafter = torch.nn.Linear(4, 2)
    seen = []
    monkeypatch.setattr(gpu_linear, "compile_variants",
                        lambda models: seen.append(list(models)) or 2 * len(seen[-1]))
    runner = SimpleNamespace(get_model=lambda: target,
                             get_draft_model=lambda: drafter if with_drafter else None)
    names = compile_linear_variants(runner)
    want = [target] + ([drafter] if with_drafter else [])
    assert seen == [want]
    assert names == [f"skinny_gemm ({2 * len(want)} weight shapes)"]
    monkeypatch.setattr(gpu_linear, "compile_variants", lambda models: 0)
    assert compile_linear_variants(runner) == []
