"""NVIDIA GPUs: our Triton kernels where they exist (torch references otherwise), CUDA graphs."""
from __future__ import annotations

from typing import ClassVar

import torch

from specdec_plugin.device.base import DeviceLayer


def skinny_gemm_accepts(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Which linear products P16 sends to ops/skinny_gemm (the rest stay cuBLAS's): half
    precision (float32 keeps cuBLAS's IEEE products, on which the exact-equality tests rest), a
    weight with unit stride along K, and a bias of the same dtype or none."""
    from specdec_plugin.ops.skinny_gemm.validate import DTYPES

    return (x.dtype in DTYPES and weight.dtype == x.dtype and weight.dim() == 2
            and weight.stride(-1) == 1 and (bias is None or bias.dtype == x.dtype))


class CudaDevice(DeviceLayer):
    name: ClassVar[str] = "cuda"
    torch_device_type: ClassVar[str] = "cuda"
    dispatch_key: ClassVar[str] = "CUDA"
    dist_backend: ClassVar[str] = "nccl"
    # vLLM's own: NCCL through pynccl, which works inside CUDA graphs (and is the only
    # communicator vLLM's graph_capture accepts for TP > 1 besides XPU's). Its custom
    # all-reduce stays off (SpecDecPlatform.use_custom_allreduce says why).
    communicator_cls: ClassVar[str] = "vllm.distributed.device_communicators.cuda_communicator.CudaCommunicator"
    device_control_env_var: ClassVar[str] = "CUDA_VISIBLE_DEVICES"
    ray_device_key: ClassVar[str] = "GPU"
    kernel_providers: ClassVar[tuple[str, ...]] = ("triton", "torch")
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16, torch.float32)
    supports_graphs: ClassVar[bool] = True
    compiles_kernels_at_first_use: ClassVar[bool] = True
    # Host n-gram matching keeps vLLM's scheduling synchronous: with every draft rejected that
    # cost 1.29-1.36x of plain decoding on the H100 (issue 11); on the device it overlaps.
    ngram_on_device: ClassVar[bool] = True
    # vLLM leaves async scheduling off for the draft model unless asked. On the H100
    # (2026-11-26, session 14, random 7B, K=4) asking for it took every-draft-rejected steps
    # from 1.22-1.36x to 1.00-1.03x of plain decoding, and acceptance-3.0 steps from 3.43 /
    # 3.76 ms/token (native, its default) to 2.44 / 2.86 at batch 1 / 16; the GPU test of
    # greedy equality under async scheduling passed (BENCHMARKS.md).
    async_draft_model: ClassVar[bool] = True
    # Suffix decoding under async scheduling (SPECDEC_SUFFIX_ASYNC=1). On the H100 (2026-11-27,
    # session 22, K=4, adaptive drafting) synchronous suffix cost 1.26-1.60x of plain decoding
    # with every draft rejected and 1.26-1.41x on prose (SmolLM2 padded to 7B, batches 1-64);
    # async, 0.99-1.03x and 1.00-1.06x. Code editing: batch 64 1.42x -> 1.01x, batch 16 equal,
    # batch 4 0.99x -> 1.04x, batch 1 0.76x -> 0.87x (the one cell where sync is clearly
    # better: its drafting steps cost less, not yet explained). BENCHMARKS.md, session 22.
    suffix_async_default: ClassVar[str] = "1"
    # Deferred drafter KV sync (spec_decode/deferred_sync.py) by default, as on the CPU: on the
    # H100 (2026-11-25, session 13) the GPU tests passed with it (34 of 34) and, with every
    # draft rejected, EAGLE-3 went from 1.06-1.11x to 1.03-1.06x of plain decoding. A user's
    # setting wins (config_defaults.apply_defaults uses setdefault).
    # Uniform draft lengths for n-gram and suffix (adaptive/uniform_drafts.py): on the H100
    # (2026-11-26, session 15, SmolLM2 padded to 7B, prose and code editing, batches 1-64)
    # ragged drafts ran piecewise graphs and cost 1.14-2.06x of plain decoding on prose; padded,
    # 1.02-1.38x, and n-gram on code editing went from 0.71-1.69x to 0.63-1.04x. Better in every
    # one of the 16 cells; the GPU tests' greedy-equality check of it passed (BENCHMARKS.md).
    # Observed step costs for suffix (adaptive/observed_cost.py), whose host drafting the
    # start-up cost table does not time: on the H100 (2026-11-27, sessions 23 and 24, SmolLM2
    # padded to 7B, real prompts, three runs) suffix on code editing at batch 16 went from
    # 1.26-1.35x of plain decoding to 1.00-1.01x, giving up its batch-1 win in two of them;
    # n-gram moved within the runs' noise, so it keeps the table alone.
    # The start-up table timed at every draft length for EAGLE-3 (adaptive/measure.py): on
    # the H200 (2026-11-29, session 40, SmolLM2 padded to 7B, prose and code edits, batches
    # 4-64, five timed runs) it was within 1.022x of the better of plain decoding and K every
    # step in all 8 cells, where the interpolated table missed prose at batch 4 (1.046x); its
    # measured 192 tokens (batch 64 drafting 2) cost 8.06 ms where interpolation said 7.52.
    # The default engine's table read the drafter at 0.50 ms against 0.24-0.36 in the others,
    # so that A/B is not clean. Other methods are not measured with it yet.
    # Observed step costs for EAGLE-3 too: on the H200 (2026-11-29, session 41, same setup,
    # batches 4/16/64, four timed runs, order swapped) the table alone drafted 1.06 tokens a
    # step on code edits at batch 64 (1.065x static K; the table put 1 and 3 drafts within 4%,
    # but a 1-draft step cost about 26% more than it said); corrected, 3.12 tokens (0.946x).
    # In decode time the corrected engine was within 1.004x of the better of plain and static
    # K in all 6 cells, the table alone 1.092x at worst; one run, not yet repeated.
    # Probes priced by what they were seen to cost (adaptive/probe_cost.py): on the H200 at
    # batch 64 with every draft rejected (session 54, 16 paired runs each) EAGLE-3 and suffix
    # probed once a 128-token run instead of two and three times, and suffix's decode went
    # from 1.011 to 1.001 of plain decoding's (intervals apart); EAGLE-3's stayed 1.019, the
    # draft model probed twice either way. Sessions 49 and 50 saw the same halving and no
    # ratio move.
    # Suffix drafts written late, just before the forward pass (spec_decode/
    # suffix_async_runner.py): on the H200 (2026-12-02, session 58, random 7.24B Llama, K=4,
    # synthetic acceptance 3.0, 5 timed runs) suffix went from 2.45 to 1.77 ms/token at batch 1
    # and from 3.08 to 2.22 at batch 16, 0.72x and 0.77x of native n-gram's in the same run;
    # the GPU suffix tests (fp32 greedy equal, bf16 flips only at near ties) pass with it.
    process_env: ClassVar[dict[str, str]] = {"SPECDEC_DEFER_DRAFTER_SYNC": "1",
                                             "SPECDEC_SUFFIX_LATE_DRAFTS": "1",
                                             "SPECDEC_UNIFORM_DRAFTS": "1",
                                             "SPECDEC_ADAPTIVE_OBSERVED_COST": "suffix,eagle3",
                                             "SPECDEC_ADAPTIVE_TABLE_LENGTHS": "eagle3",
                                             "SPECDEC_ADAPTIVE_PROBE_COST": "observed"}
    # Graph replays are quick to time: measure more sizes.
    step_cost_budget_s = 10.0
    # Inductor fuses the norm / rotary / activation code between our attention calls, as on
    # vLLM's own CUDA platform. With "eager" the 7B EAGLE step measured 10.5 ms/token against
    # 2.7 with Inductor (H100, benchmarks/profile_engine.py, 2026-11-22).
    compile_backend: ClassVar[str] = "inductor"
    pin_memory: ClassVar[bool] = True
    install_hint: ClassVar[str] = "a CUDA build of torch and an NVIDIA driver"
    # torch.ops._C.weak_ref_tensor, which vLLM's CUDA graph wrapper calls on captured outputs.
    vllm_extensions: ClassVar[tuple[str, ...]] = ("vllm._C_stable_libtorch",)

    @classmethod
    def is_present(cls) -> bool:
        # NVML answers without creating a CUDA context (so forked workers stay usable).
        try:
            import pynvml
        except ImportError:  # no NVML bindings: ask the CUDA runtime (no context is created)
            return torch.cuda.is_available()
        try:
            pynvml.nvmlInit()
            try:
                return pynvml.nvmlDeviceGetCount() > 0
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # no driver, no library: no GPU
            return False

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def device_name(self, device_id: int = 0) -> str:
        return torch.cuda.get_device_name(device_id)

    def total_memory(self, device_id: int = 0) -> int:
        return torch.cuda.get_device_properties(device_id).total_memory

    def memory_usage(self, device=None) -> float:
        torch.cuda.reset_peak_memory_stats(device)
        return float(torch.cuda.max_memory_allocated(device))

    def compute_units(self, device_id: int = 0) -> int:
        return torch.cuda.get_device_properties(device_id).multi_processor_count

    def set_device(self, device: torch.device) -> None:
        torch.cuda.set_device(device)

    def manual_seed_all(self, seed: int) -> None:
        torch.cuda.manual_seed_all(seed)

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def set_sync_debug_mode(self, mode: str) -> bool:
        torch.cuda.set_sync_debug_mode(mode)
        return True

    def worker_device(self, local_rank: int) -> torch.device:
        return torch.device(f"cuda:{local_rank}")

    def prepare_worker_process(self, workers_on_host: int = 1) -> None:
        # P16 (patches/gpu_linear.py), opt-in: products of a few token rows through our skinny
        # GEMM (no gain in an EAGLE-3 engine on the H100, BENCHMARKS session 65). Never under
        # vLLM's batch-invariant mode, which brings its own GEMM for every size.
        from vllm import envs as vllm_envs

        from specdec_plugin import envs
        if not envs.skinny_gemm() or vllm_envs.VLLM_BATCH_INVARIANT:
            return
        from specdec_plugin.ops.registry import get_kernel
        from specdec_plugin.ops.skinny_gemm.triton import max_rows_worth_it
        from specdec_plugin.patches import gpu_linear

        # Rows per weight: 16, or 64 where the kernel's wide tile beat cuBLAS on the H100.
        gpu_linear.apply(get_kernel("skinny_gemm", self.kernel_providers),
                         skinny_gemm_accepts, max_rows_worth_it, self.dispatch_key)

    def measures_memory(self) -> bool:
        return True

    def new_graph_pool(self):
        return torch.cuda.graph_pool_handle()

    def new_stream(self):
        return torch.cuda.Stream()

    def capture_graph(self, fn, pool, stream):
        graph = torch.cuda.CUDAGraph()
        stream.wait_stream(torch.cuda.current_stream())
        # capture_begin/end rather than torch.cuda.graph(): that context also synchronizes the
        # device, collects garbage and empties the cache, a stall we do not need mid-serving.
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                result = fn()
            except BaseException:
                try:
                    graph.capture_end()
                except Exception:  # the capture is already broken; report fn's error
                    pass
                raise
            graph.capture_end()
        return graph, result

    def run_on_stream(self, fn, stream):
        current = torch.cuda.current_stream()
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            result = fn()
        current.wait_stream(stream)
        return result
