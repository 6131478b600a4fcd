"""Every change the plugin makes to vLLM (and torch) where vLLM has no hook: the catalog.

Everything else goes through vLLM's hooks (Platform, worker_cls, the attention registry,
subclasses, the runner's attributes after its constructor). Each patch below says why it exists,
what it changes, the vLLM 0.26 source it replaces ("Replaces", paths under vllm/), and when it
can go. tests/test_patch_catalog.py fails when one of those vLLM symbols changes shape.
P1-P3, P7, P9, P14 are applied in a worker process, before the model runner is built, by
``apply_worker_patches`` (idempotent); P4-P5 by the CPU device layer in its worker process;
P10 by the model runner where it applies; P12 by P6 and at our platform module's import; P13 by
our scheduler's constructor; P6, P8 and P15 from the ``vllm.general_plugins`` entry point; P16
by the CUDA device layer in its worker process.

P1 kernel warm-up (``vllm.v1.worker.gpu_worker.kernel_warmup``)
   Why: vLLM's warm-up imports CUDA fusion modules that touch ``torch.ops._C.rotary_embedding``
   at import; the 0.26 wheel ships no ``_C``, so every platform without it fails there.
   What: our warm-up, which warms the block-table slot-mapping kernel (all our runner needs).
   Replaces: v1/worker/gpu_worker.py:780 ``kernel_warmup(self)``.
   When it can go: when vLLM lets a platform choose its warm-up, or guards those imports.

P2 vLLM's Triton kernels of EAGLE/MTP input prep and slot mapping (``patches/vllm_kernels.py``)
   Why: without a Triton driver (CPU) vLLM's ``@triton.jit`` is a placeholder and
   ``kernel[grid](...)`` raises TypeError; on GPUs we want our own kernels everywhere.
   What: the module attributes listed by ``ops/spec_prep/vllm_shims.py`` are replaced by
   adapters that accept vLLM's launch syntax and call our kernel (torch or our Triton one).
   The rejection sampler is not patched here: the runner replaces vLLM's sampler object with
   ``spec_decode/rejection_sampler.py`` (one path), so vLLM's rejection kernels never launch.
   Replaces: the ``kernel[grid](...)`` launches of v1/worker/block_table.py
   ``_compute_slot_mapping_kernel`` and v1/spec_decode/utils.py ``eagle_*`` /
   ``copy_and_expand_eagle_inputs_kernel`` (also imported into llm_base_proposer.py).
   When it can go: when vLLM dispatches these kernels through the platform (as it does for
   attention) or exposes them as CustomOps.

P3 repetition penalties (``vllm._custom_ops.apply_repetition_penalties``)
   Why: on CUDA tensors vLLM calls ``torch.ops._C.apply_repetition_penalties_``, absent from
   the 0.26 wheel, so a request with ``repetition_penalty`` fails on GPU.
   What: always the torch implementation vLLM already has.
   Replaces: _custom_ops.py:350 ``if logits.is_cuda and logits.is_contiguous():`` (the branch).
   When it can go: when the `_C` call is guarded by ``hasattr`` or a platform check.

P4 ``torch.accelerator.synchronize`` / ``empty_cache`` on a GPU-less machine (patches/cpu_streams.py)
   Why: the V1 runner calls them in profiling and cleanup; a CUDA torch with no GPU raises.
   What: no-ops, only when torch reports no accelerator.
   Replaces: v1/worker/gpu_model_runner.py:1160 and :6502-6503 ``torch.accelerator.*()``.
   When it can go: when the runner routes these through ``Platform``.

P5 ``torch.Event``, ``torch.cuda.Event/Stream/current_stream/stream`` in a CPU worker process
   (patches/cpu_streams.py, applied by device/cpu.py ``prepare_worker_process``)
   Why: ``GPUModelRunner`` creates CUDA events and streams unconditionally, and uses streams
   at run time for drafter outputs (EAGLE family); with no GPU they raise.
   What: host stand-ins for the life of the worker process, only when torch has no
   accelerator (that process computes on the CPU only).
   Replaces: v1/worker/gpu_model_runner.py:738-741, :892-896, :916-917 (streams and events made
   in the constructor) and ``with torch.cuda.stream(...)`` at :287/:417.
   When it can go: when the runner asks the platform for events and streams.

P6 input checks before ``ModelConfig`` (``EngineArgs.create_engine_config``, patches/engine_args.py)
   Why: vLLM reads the model config before any platform hook sees the arguments, so a missing
   local model path surfaces as a Hugging Face Hub error about repo ids.
   What: a wrapper that checks local model and draft-model paths first, then calls vLLM's;
   it also records the user's graph capture sizes, which the platform can no longer tell from
   vLLM's defaults when it sees the config (capture_sizes.py: rounded to n*(1+K) with a warning),
   and turns method "ngram" into vLLM's "ngram_gpu" where the device layer matches n-grams on
   the device (spec_decode/ngram_device.py): here, because vLLM resolves async scheduling from
   the method inside ``VllmConfig.__post_init__`` (config/vllm.py:1059-1080), before any
   platform hook, and allows it for "ngram_gpu" only. For the same reason it sets an unset
   ``async_scheduling`` to True for the draft model where the device layer says
   ``async_draft_model`` (spec_decode/async_default.py: vLLM resolves unset to off for that
   method, though it accepts True).
   Around the build it applies P12 when ``SPECDEC_SUFFIX_ASYNC`` is on.
   Replaces: engine/arg_utils.py:1847 ``EngineArgs.create_engine_config`` (wrapped, not changed).
   Installed from the ``vllm.general_plugins`` entry point (vLLM loads it in
   ``EngineArgs.__post_init__``), unlike P1-P5 which are applied in workers.
   When it can go: when a platform hook receives the engine arguments before ModelConfig.

P7 the n-gram and suffix proposer classes the V1 runner builds (patches/proposers.py ``PROPOSERS``)
   Why: the runner picks its drafter class by name with no plugin hook (``custom_class`` gets
   neither the input batch nor a runner). The EAGLE family and the draft model need no patch:
   the model runner replaces ``self.drafter`` after ``super().__init__()``
   (spec_decode/runner_drafters.py), the runner's seam. These two cannot use that seam, because
   vLLM's constructor must not run: the suffix one imports arctic-inference (not installed), the
   n-gram one JIT-compiles numba on a 1024 x max_model_len batch at every start.
   The same holds for the device n-gram proposer (method "ngram_gpu", what "ngram" becomes on
   GPUs): vLLM's constructor compiles its own matching kernel with Inductor and runs it on a
   max_num_seqs x max_model_len dummy batch; ours matches with ops/ngram_match.
   What: those names are rebound to our subclasses on csrc/ and ops/ngram_match (the runner's
   type checks accept subclasses).
   Replaces: v1/worker/gpu_model_runner.py:602 ``self.drafter = NgramProposer(self.vllm_config)``,
   :610 ``self.drafter = NgramProposerGPU(self.vllm_config, self.device, self)`` and
   :634 ``self.drafter = SuffixDecodingProposer(self.vllm_config)``.
   When it can go: when vLLM lets a platform register proposers per method.

P8 ``vllm.config.speculative.has_arctic_inference`` (patches/suffix_config.py)
   Why: ``SpeculativeConfig`` rejects ``method="suffix"`` unless arctic-inference is
   installed; our suffix proposer does not use it.
   What: the check asks whether our C++ index loads instead. Process 0, like P6.
   Replaces: config/speculative.py:1053 ``if not has_arctic_inference():``.
   When it can go: when the suffix proposer is pluggable.

P9 ``vllm.v1.worker.gpu_model_runner.bind_kv_cache`` (patches/bind_kv_cache.py)
   Why: with a draft model of the target's architecture two attention layers share a layer
   index; vLLM accepts that only for CUDA/XPU/its CPU platform and raises for others.
   What: the same binding without the platform check (the runner handles it the same way).
   Replaces: v1/worker/utils.py:482 ``bind_kv_cache`` (its check at :523-532), called from
   v1/worker/gpu_model_runner.py:7526.
   When it can go: when the check covers out-of-tree platforms that use the V1 runner.

P10 ``torch.zeros(pin_memory=...)`` and ``torch.Tensor.pin_memory`` on a worker with no
   accelerator (patches/host_pinning.py), only when method "ngram_gpu" runs there
   (``SPECDEC_NGRAM_ON_DEVICE=1`` on the CPU: the engine tests of the device n-gram path)
   Why: the V1 runner allocates the ngram_gpu staging buffers with a literal
   ``pin_memory=True`` and pins each new request's history; a CUDA torch without a GPU raises.
   What: memory stays unpinned (the same thing in a process that computes on the CPU only).
   Applied by the model runner before vLLM's constructor, for the life of that process.
   Replaces: v1/worker/gpu_model_runner.py:620-625 (``torch.zeros(..., pin_memory=True)``) and
   v1/spec_decode/ngram_proposer_gpu.py:553, :599 (``.pin_memory()``).
   When it can go: when those allocations ask ``is_pin_memory_available()`` as the rest do.

P11 linear layers and the LM head on the CPU (patches/cpu_linear.py, applied by device/cpu.py
   ``prepare_worker_process``)
   Why: vLLM repacks CPU linear weights and picks a fast GEMM only for its own CPU platform
   (``current_platform.is_cpu()``); an out-of-tree platform gets ``F.linear`` on the unpacked
   fp32 weight, 75-85% of a CPU decode step and about half the speed of packed oneDNN.
   What: ``UnquantizedLinearMethod`` / ``UnquantizedEmbeddingMethod``'s
   ``process_weights_after_loading`` and ``apply`` are wrapped: weights packed once (ops/linear
   ``pack_linear_weight`` of the provider and dtype ``CpuDevice.linear_packing`` chooses per
   weight; the LM head at its first product), a linear layer's unpacked weight then released,
   CPU inputs run that provider's ``linear``; everything else calls vLLM's.
   Replaces: model_executor/layers/linear.py:214-228 and vocab_parallel_embedding.py:61-75 (the
   ``is_cpu()`` branch of ``process_weights_after_loading`` and
   ``dispatch_unquantized_gemm()(layer, x, layer.weight, bias)`` in ``apply``; layers/utils.py:338
   ``dispatch_unquantized_gemm``).
   When it can go: when ``dispatch_unquantized_gemm`` / the CPU weight packing ask the platform
   (e.g. a ``Platform`` hook for unquantized GEMMs) instead of ``is_cpu()``.

P12 method "suffix" among vLLM's async-capable speculative methods, only while
   ``SPECDEC_SUFFIX_ASYNC`` is on (unset: the device layer's ``suffix_async_default``, on for
   CUDA GPUs) (``vllm.config.vllm.NgramGPUTypes``, patches/suffix_async_types.py)
   Why: vLLM turns async scheduling off for suffix and raises when it is asked for; the platform
   hook can turn it back on, but every engine-core process runs ``VllmConfig.__post_init__``
   again after its handshake and raises there, before any hook. The lazy suffix proposer
   (spec_decode/suffix_lazy.py) runs under async scheduling.
   What: that name, which config/vllm.py reads only in its two async-scheduling checks, rebound
   in that module to ``Literal["ngram_gpu", "suffix"]``: vLLM then resolves async scheduling for
   suffix as for ``ngram_gpu``. Applied around each ``create_engine_config`` by P6 (and undone
   after it), and in other processes from our platform module's import (a one-shot import hook
   rebinds it when config/vllm.py has run).
   Replaces: config/vllm.py:1040-1041 and :1073-1074 (``get_args(NgramGPUTypes)``, imported :49);
   the re-run is v1/engine/core.py:1173.
   When it can go: when vLLM lets a proposer declare that it supports async scheduling, or when
   the suffix proposer's lazy drafts are measured and upstreamed.

P13 the last block of a prefix-cache hit with an EAGLE-family drafter
   (spec_decode/drafter_prefix_cache.py, applied by adaptive/scheduler.py after vLLM's
   ``Scheduler.__init__`` built its KV cache manager)
   Why: vLLM drops the last matched block of every prefix-cache hit for EAGLE / EAGLE-3 / MTP
   and recomputes its tokens through the target, so that the drafter's KV at the hit's last
   position (made from the next token, which the block's hash does not cover) is exact. On the
   H100 that recomputation was the largest single item of EAGLE-3's cost over plain decoding
   at batch 64 with prompts in the cache (session 26); a stale drafter KV entry at one
   position only makes drafts worse, never the output.
   What: the unitary coordinator's set of groups that get the drop is emptied (and its full
   attention manager's ``use_eagle`` cleared, as vLLM derives it from that set), only with one
   KV cache group of full attention; ``SPECDEC_RECOMPUTE_DRAFTER_BLOCK=1`` keeps vLLM's drop.
   Replaces: v1/core/kv_cache_coordinator.py:99-104 (``eagle_group_ids``) and :484, read by
   :497 ``drop_eagle_block=0 in self.eagle_group_ids`` (the drop itself is
   v1/core/single_type_kv_cache_manager.py:742-743).
   When it can go: when vLLM recomputes one token instead of a block, or lets the platform
   choose the drop.

P14 the computed-token correction of async speculative decoding
   (``vllm.v1.worker.gpu_model_runner.update_num_computed_tokens_for_batch_change``,
   patches/async_drift.py)
   Why: vLLM wraps it in ``torch.compile(dynamic=True)``, and Dynamo specialises sizes 0 and 1:
   the first step after a one-request batch, or with one request after a larger batch,
   compiles it again while serving. On the H100 that stalled one ``execute_model`` call for
   0.3-1.0 s and made EAGLE-3's timed runs up to 1.8x slower at random (session 27); which
   steps meet those sizes depends on request arrival, so no warm-up covers them.
   What: the module's name rebound to our kernel (ops/async_drift: one Triton launch compiled
   at start-up, its torch reference elsewhere), with vLLM's exact semantics and arguments.
   Replaces: v1/spec_decode/utils.py:565 (the decorated function), imported by name at
   v1/worker/gpu_model_runner.py:209 and called at :2143.
   When it can go: when vLLM marks those sizes unbacked (no 0/1 specialisation) or writes the
   correction as a kernel.

P15 our draft-length counter in offline engines (``vllm.v1.engine.llm_engine.LLMEngine.__init__``,
   patches/offline_stat_loggers.py)
   Why: vLLM loads the ``vllm.stat_logger_plugins`` entry points (ours:
   ``vllm:spec_decode_draft_length``, adaptive/metrics.py) only in ``AsyncLLM``; an ``LLM(...)``
   engine never creates them, so offline users and our benchmarks could not read the lengths
   the controller chose from ``LLM.get_metrics()``.
   What: ``__init__`` wrapped to add our stat logger to its ``stat_loggers`` argument (a
   user's own loggers stay). Installed with P6 from the ``vllm.general_plugins`` entry point.
   Replaces: v1/engine/llm_engine.py:115-120 (``StatLoggerManager(custom_stat_loggers=
   stat_loggers, ...)``), against v1/engine/async_llm.py:121 (which adds the plugins).
   When it can go: when ``LLMEngine`` loads stat-logger plugins as ``AsyncLLM`` does.

P16 linear layers and the LM head of a few token rows on the GPU (patches/gpu_linear.py, applied
   by device/cuda.py ``prepare_worker_process`` with ``SPECDEC_SKINNY_GEMM=1``)
   Why: ``dispatch_unquantized_gemm`` gives every platform but ROCm and vLLM's CPU ``F.linear``;
   at 1-64 token rows (small-batch decode and verification) cuBLAS reads some weights well
   under the memory's rate, and a platform cannot choose another GEMM.
   What: ``UnquantizedLinearMethod`` / ``UnquantizedEmbeddingMethod``'s ``apply`` wrapped: a
   GPU input in bfloat16 / float16 goes to the custom op ``torch.ops.specdec.skinny_linear``
   (ops/skinny_gemm for at most 16 rows, or 64 where the device layer's ``max_rows`` says its
   wide tile pays; ``F.linear`` above); everything else calls vLLM's. Each weight shape's
   kernel compiles at engine start, per row tile (worker/kernel_warmup.py).
   Replaces: model_executor/layers/linear.py:228 and vocab_parallel_embedding.py:75
   (``dispatch_unquantized_gemm()(layer, x, layer.weight, bias)``; layers/utils.py:338).
   When it can go: with P11, when ``dispatch_unquantized_gemm`` asks the platform.
"""
from __future__ import annotations

from specdec_plugin import envs

_applied: set[str] = set()


def apply_worker_patches(kernel_providers: tuple[str, ...]) -> None:
    """P1-P3, P7, P9, P14: in a worker process, before the model runner is built. P2's and
    P14's kernels are the first of ``kernel_providers`` (the device layer's) that has each."""
    if "worker" in _applied:
        return
    from specdec_plugin.patches import (
        async_drift,
        bind_kv_cache,
        proposers,
        repetition_penalty,
        vllm_kernels,
        warmup,
    )

    bind_kv_cache.apply()
    warmup.apply()
    vllm_kernels.apply(kernel_providers)
    repetition_penalty.apply()
    proposers.apply()
    async_drift.apply(kernel_providers)
    _applied.add("worker")


def apply_engine_patches() -> None:
    """P6, P8, P15: entry point of ``vllm.general_plugins`` (every vLLM process, first of all
    the one that builds the engine config). A no-op when the plugin is disabled."""
    if "engine" in _applied or envs.disabled():
        return
    from specdec_plugin.patches import engine_args, offline_stat_loggers, suffix_config

    engine_args.apply()
    suffix_config.apply()
    offline_stat_loggers.apply()
    _applied.add("engine")
