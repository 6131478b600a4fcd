"""Each catalogued patch (specdec_plugin/patches/__init__.py) against the vLLM source it replaces.

vLLM's installed source is read, not imported, so patches other tests applied do not matter. A
test fails when the patched symbol changes shape (parameters, the call site we rely on, the
attribute we replace), which is when the patch must be revisited.
"""
from __future__ import annotations

import ast
import importlib.util
import inspect
import pathlib

import torch

VLLM = pathlib.Path(importlib.util.find_spec("vllm").submodule_search_locations[0])


def _source(relpath: str) -> str:
    return (VLLM / relpath).read_text()


def _params(relpath: str, name: str, cls: str | None = None) -> list[str]:
    """Parameter names of ``name`` (a function, or a method of ``cls``) as defined in vLLM."""
    tree = ast.parse(_source(relpath))
    body = tree.body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            a = node.args
            return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    raise AssertionError(f"{name} is no longer defined in vllm/{relpath}")


def _module_file(module: str) -> str:
    return module.removeprefix("vllm.").replace(".", "/") + ".py"


def test_p1_kernel_warmup():
    assert "kernel_warmup(self)" in _source("v1/worker/gpu_worker.py")
    assert _params("model_executor/warmup/kernel_warmup.py", "kernel_warmup") == ["worker"]


def test_p2_spec_prep_shims_take_vllms_kernel_arguments():
    from specdec_plugin.ops.spec_prep.vllm_shims import shim_table

    for (module, symbol), shim in shim_table(("torch",)).items():
        relpath = _module_file(module)
        text = _source(relpath)
        if f"def {symbol}(" not in text:  # imported by name (llm_base_proposer)
            tree = ast.parse(text)
            sources = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                       and any(a.name == symbol for a in n.names)]
            assert sources, f"{module} no longer has {symbol}"
            relpath = _module_file(sources[0])
        ours = [p for p in inspect.signature(shim.adapter).parameters
                if p not in ("grid", "_launch_options")]
        assert _params(relpath, symbol) == ours, f"{module}.{symbol} changed its parameters"


def test_p3_repetition_penalties():
    text = _source("_custom_ops.py")
    assert "torch.ops._C.apply_repetition_penalties_" in text
    assert (_params("_custom_ops.py", "apply_repetition_penalties")
            == _params("_custom_ops.py", "apply_repetition_penalties_torch"))


def test_p4_p5_cpu_stand_ins():
    from specdec_plugin.patches import cpu_streams

    text = _source("v1/worker/gpu_model_runner.py")
    for call in ("torch.accelerator.synchronize()", "torch.accelerator.empty_cache()",
                 "torch.cuda.Event(", "torch.Event()", "torch.cuda.Stream()",
                 "torch.cuda.current_stream()", "with torch.cuda.stream("):
        assert call in text, f"the V1 runner no longer calls {call}"
    for owner, attr in cpu_streams.table():
        assert hasattr(owner, attr), f"torch has no {attr} to stand in for"


def test_p6_create_engine_config():
    assert _params("engine/arg_utils.py", "create_engine_config", cls="EngineArgs") == [
        "self", "usage_context", "headless"]


def test_p7_and_runner_seam_drafter_construction():
    text = _source("v1/worker/gpu_model_runner.py")
    # P7: names looked up when the runner is built (ngram imported locally, suffix globally).
    assert "from vllm.v1.spec_decode.ngram_proposer import NgramProposer" in text
    assert "self.drafter = NgramProposer(self.vllm_config)" in text
    assert "self.drafter = SuffixDecodingProposer(self.vllm_config)" in text
    assert "from arctic_inference" in _source("v1/spec_decode/suffix_decoding.py")
    # The seam runner_drafters.py uses: same constructor arguments as vLLM's drafters.
    assert "self.drafter = EagleProposer(self.vllm_config, self.device, self)" in text
    for relpath, cls in (("v1/spec_decode/eagle.py", "EagleProposer"),
                         ("v1/spec_decode/draft_model.py", "DraftModelProposer")):
        assert _params(relpath, "__init__", cls=cls) == ["self", "vllm_config", "device", "runner"]


def test_p7_device_ngram_proposer():
    text = _source("v1/worker/gpu_model_runner.py")
    # Looked up as a module global when the runner is built, with these arguments.
    assert "self.drafter = NgramProposerGPU(self.vllm_config, self.device, self)" in text
    path = "v1/spec_decode/ngram_proposer_gpu.py"
    assert _params(path, "__init__", cls="NgramProposerGPU") == [
        "self", "vllm_config", "device", "runner"]
    # The runner calls propose positionally with these; ours keeps the order.
    from specdec_plugin.spec_decode.ngram_device import SpecDecNgramProposerGPU

    theirs = _params(path, "propose", cls="NgramProposerGPU")
    assert theirs == list(inspect.signature(SpecDecNgramProposerGPU.propose).parameters)
    # vLLM resolves async scheduling from the method before platform hooks (why P6 maps it).
    assert "NgramGPUTypes" in _source("config/vllm.py")
    # NgramTrimReportMixin: the runner trims its copy of the scheduler output in _update_states,
    # and the async output returns the ModelRunnerOutput it wraps (the trims ride on it).
    assert "update_scheduler_for_invalid_drafts(" in text
    assert "self._model_runner_output = model_runner_output" in text
    assert "output = self._model_runner_output" in text
    # Uniform drafts (NgramTrimReportMixin._update_states_untrimmed) keep every slot by handing
    # the trim these two runner attributes: it must still wait on the one and read the other.
    assert ("self._num_valid_draft_tokens_event,\n                self._num_valid_draft_tokens_cpu,"
            in text)
    trim = _source("v1/spec_decode/ngram_proposer_gpu.py").split(
        "def update_scheduler_for_invalid_drafts(", 1)[1].split("\ndef ", 1)[0]
    assert "num_valid_draft_tokens_event.synchronize()" in trim
    assert "valid_k = int(num_valid_draft_tokens_cpu[req_index].item())" in trim
    assert "valid_k = max(0, min(valid_k, scheduled_k))" in trim
    assert _params("v1/core/sched/scheduler.py", "update_from_output", cls="Scheduler") == [
        "self", "scheduler_output", "model_runner_output"]


def test_p10_pinned_staging_buffers():
    text = _source("v1/worker/gpu_model_runner.py")
    assert text.count("pin_memory=True") >= 2 and "self._ngram_pinned_idx_buf = torch.zeros(" in text
    assert ".pin_memory()" in _source("v1/spec_decode/ngram_proposer_gpu.py")


def test_p8_arctic_inference_check():
    text = _source("config/speculative.py")
    assert "if not has_arctic_inference():" in text
    assert "has_arctic_inference" in text.split("class SpeculativeConfig")[0]  # module-level name


def test_p9_bind_kv_cache():
    from specdec_plugin.patches.bind_kv_cache import bind_kv_cache

    theirs = _params("v1/worker/utils.py", "bind_kv_cache")
    assert theirs == list(inspect.signature(bind_kv_cache).parameters)
    assert "bind_kv_cache,\n" in _source("v1/worker/gpu_model_runner.py")  # imported by name


def test_cpu_stand_ins_apply_without_accelerator(monkeypatch):
    from specdec_plugin.patches import cpu_streams

    for owner, attr in cpu_streams.table():  # recorded, so the test undoes whatever apply() sets
        monkeypatch.setattr(owner, attr, getattr(owner, attr))
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    cpu_streams.apply()
    assert torch.cuda.Event is cpu_streams.EventStandIn
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.cuda.current_stream().wait_event(torch.Event())


def test_p11_cpu_linear_methods():
    from specdec_plugin.patches import cpu_linear

    for relpath, cls in (("model_executor/layers/linear.py", "UnquantizedLinearMethod"),
                         ("model_executor/layers/vocab_parallel_embedding.py",
                          "UnquantizedEmbeddingMethod")):
        assert _params(relpath, "process_weights_after_loading", cls=cls) == ["self", "layer"]
        assert _params(relpath, "apply", cls=cls) == ["self", "layer", "x", "bias"]
        # What P11 replaces: the platform check, and the GEMM dispatch on the unpacked weight.
        text = _source(relpath)
        assert "if current_platform.is_cpu():" in text
        assert "return dispatch_unquantized_gemm()(layer, x, layer.weight, bias)" in text
    # The LM head's products go through apply (packed lazily there, see cpu_linear.py).
    assert "lm_head.quant_method.apply(" in _source("model_executor/layers/logits_processor.py")
    assert callable(cpu_linear.apply)


def test_p16_gpu_linear_methods():
    from specdec_plugin.patches import gpu_linear

    for relpath, cls in (("model_executor/layers/linear.py", "UnquantizedLinearMethod"),
                         ("model_executor/layers/vocab_parallel_embedding.py",
                          "UnquantizedEmbeddingMethod")):
        assert _params(relpath, "apply", cls=cls) == ["self", "layer", "x", "bias"]
        assert "return dispatch_unquantized_gemm()(layer, x, layer.weight, bias)" in \
            _source(relpath)
    # The platform choice P16 stands in for: none for an out-of-tree platform.
    utils = _source("model_executor/layers/utils.py")
    assert "def dispatch_unquantized_gemm()" in utils
    assert "return default_unquantized_gemm" in utils
    assert callable(gpu_linear.apply)


def test_p12_suffix_counted_as_async_capable():
    # config/vllm.py imports the name from .speculative and reads it only in its two checks of
    # async scheduling against the method; the engine core runs __post_init__ again.
    text = _source("config/vllm.py")
    assert "from .speculative import EagleModelTypes, NgramGPUTypes, SpeculativeConfig" in text
    uses = [line.strip() for line in text.splitlines() if "NgramGPUTypes" in line]
    assert uses[1:] == ["and self.speculative_config.method not in get_args(NgramGPUTypes)"] * 2
    assert text.index("get_args(NgramGPUTypes)") < text.index(
        "current_platform.check_and_update_config(self)")
    assert "vllm_config.__post_init__()" in _source("v1/engine/core.py")
    assert 'return self.method == "ngram_gpu"' in _source("config/speculative.py")


def test_p13_eagle_block_drop_read_from_the_group_set():
    # The unitary coordinator decides the drop from eagle_group_ids alone, and derives its
    # manager's use_eagle from it; the drop itself shortens the hit by a block.
    text = _source("v1/core/kv_cache_coordinator.py")
    unitary = text[text.index("class UnitaryKVCacheCoordinator"):text.index("class SpecGroup")]
    assert "drop_eagle_block=0 in self.eagle_group_ids," in unitary
    assert "self.single_type_managers[0].use_eagle = 0 in self.eagle_group_ids" in unitary
    assert "self.eagle_group_ids: set[int] = {" in text
    manager = _source("v1/core/single_type_kv_cache_manager.py")
    assert "if drop_eagle_block and hit_length > 0:" in manager
    assert "self.kv_cache_manager = KVCacheManager(" in _source("v1/core/sched/scheduler.py")


def test_p14_computed_token_correction_imported_by_name_and_compiled(monkeypatch):
    import vllm.v1.worker.gpu_model_runner as gpu_model_runner

    from specdec_plugin.patches import async_drift
    from specdec_plugin.patches.async_drift import TARGET

    # Applied: the runner's module calls our kernel of the device's first provider.
    monkeypatch.setattr(gpu_model_runner, TARGET[1], getattr(gpu_model_runner, TARGET[1]))
    async_drift.apply(("torch",))
    from specdec_plugin.ops.async_drift.reference import correct_computed_tokens

    assert getattr(gpu_model_runner, TARGET[1]) is correct_computed_tokens

    module, name = TARGET
    runner = _source(_module_file(module))
    assert f"from vllm.v1.spec_decode.utils import {name}" in runner
    assert f"            {name}(" in runner  # the call site in _prepare_inputs
    utils = _source("v1/spec_decode/utils.py")
    decorated = utils[:utils.index(f"def {name}(")].rstrip().splitlines()[-1]
    assert decorated.startswith("@torch.compile(dynamic=True")
    assert _params("v1/spec_decode/utils.py", name) == [
        "num_computed_tokens", "num_accepted_tokens", "prev_positions",
        "valid_sampled_token_count", "prev_num_draft_tokens", "cpu_num_computed_tokens"]
    assert list(inspect.signature(correct_computed_tokens).parameters) == _params(
        "v1/spec_decode/utils.py", name)


def test_p15_offline_engines_ignore_stat_logger_plugins():
    # Why P15 exists: AsyncLLM adds the plugins' loggers, LLMEngine hands its stat_loggers
    # argument alone to the manager (when this fails, the patch can go).
    assert "load_stat_logger_plugin_factories()" in _source("v1/engine/async_llm.py")
    engine = _source("v1/engine/llm_engine.py")
    assert "load_stat_logger_plugin_factories" not in engine
    assert "custom_stat_loggers=stat_loggers," in engine
    assert "stat_loggers" in _params("v1/engine/llm_engine.py", "__init__", cls="LLMEngine")

    from specdec_plugin.adaptive.metrics import DraftLengthStatLogger
    from specdec_plugin.patches.offline_stat_loggers import with_draft_length_logger

    # Ours once, after a user's own.
    assert with_draft_length_logger(None) == [DraftLengthStatLogger]
    mine = object()
    assert with_draft_length_logger([mine]) == [mine, DraftLengthStatLogger]
    assert with_draft_length_logger([DraftLengthStatLogger]) == [DraftLengthStatLogger]
