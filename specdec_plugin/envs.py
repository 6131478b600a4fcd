"""Environment variables the plugin reads, in one place.

- ``SPECDEC_DISABLE=1``: the plugin declines; vLLM uses its own platform.
- ``SPECDEC_DEVICE=cpu|cuda|npu``: force a device instead of detecting one. Forcing a device
  that is absent is an error raised when the engine config is built.
- ``SPECDEC_CPU_KV_CACHE_GIB``: KV-cache budget on CPU (default 2 GiB), unless the user passes
  vLLM's ``kv_cache_memory_bytes``.
- ``SPECDEC_CPU_THREADS``: torch threads on CPU (default: every core this process may use).
- ``SPECDEC_DRAFTER_GRAPHS=0``: run the drafter's steps eagerly (vLLM's V1 way: piecewise
  graphs, attention outside them) instead of replaying our graphs of them. Default on where
  the device has graphs.
- ``SPECDEC_DRAFTER_PADDING=0``: record EAGLE / EAGLE-3 / MTP / draft-model drafter graphs per
  exact batch shape, the first time each shape is met while serving, instead of padding batches
  to a few shapes that are all recorded at engine start (spec_decode/drafter_padding.py).
  Default on.
- ``SPECDEC_DEFER_DRAFTER_SYNC=0|1``: whether the EAGLE / EAGLE-3 / MTP / draft-model drafter's
  pass (the draft model's not where its graphs are recorded unpadded) over the new tokens of a
  step that drafts nothing (k = 0) is deferred, and one pass over a request's deferred tokens
  runs when it next needs its drafter (spec_decode/deferred_sync.py), or runs every step as
  vLLM does. Default: the device layer's (on for the CPU and CUDA GPUs, where it has run; off
  on NPUs until it has run on one).
- ``SPECDEC_KV_ONLY_FLUSH=0``: deferred flushes of single-layer EAGLE / EAGLE-3 drafters run
  the drafter's full pass (as the draft model's do) instead of writing only its KV
  (spec_decode/drafter_kv_writer.py). Default on.
- ``SPECDEC_RECOMPUTE_DRAFTER_BLOCK=1``: with an EAGLE / EAGLE-3 / MTP drafter, give up the
  last block of every prefix-cache hit and recompute it, as vLLM does, so that the drafter's KV
  at the hit's last position is exact. Default off: the block is kept (one position's drafter
  KV may then come from another request's next token; spec_decode/drafter_prefix_cache.py).
  With our scheduler (adaptive drafting) only.
- ``SPECDEC_ADAPTIVE=0``: draft K tokens every step, as vLLM does, instead of letting the
  adaptive controller choose 0..K per step from observed acceptance and measured step costs
  (default on; a user-given ``num_speculative_tokens_per_batch_size`` also turns it off).
- ``SPECDEC_ADAPTIVE_OBSERVED_COST=0|1|<methods>``: whether the adaptive controller corrects
  the step costs measured at engine start, per draft length, by the step times it observes
  while serving (adaptive/observed_cost.py): ``1`` every method, ``0`` none, or a comma list
  of methods (``suffix``, ``ngram,suffix``). Unset: ``0``; the CUDA device layer sets
  ``suffix,eagle3``. Suffix's host drafting the start-up table does not time: on the H100
  (sessions 23 and 24, three runs) the correction took suffix on code editing at batch 16 from
  1.26-1.35x of plain decoding to 1.00-1.01x, at the price of its batch-1 win in two of the
  runs. EAGLE-3 on the H200 (session 41, one run): the table alone drafted one token a step on
  code edits at batch 64 (1.065x static K), corrected 3.1 (0.946x). n-gram moved within
  run-to-run noise. The CPU device layer sets ``ngram,eagle3``: n-gram on code edits at
  batch 4 (session 36) and EAGLE-3 on chat at batch 8 (session 39) drafted where the table alone
  misjudged the cost. EAGLE, MTP and the draft model did no better with it on the CPU at
  batch 8 (session 39), so they keep the table alone there.
- ``SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST=0|1|<methods>``: on graph devices, the start-up cost
  table times each draft length's drafting as the padded drafter graph a step of that length
  replays (spec_decode/drafter_graphs.py), instead of one drafter pass per token timed through
  vLLM's ``dummy_run`` (adaptive/measure.py): ``1`` every method with a drafter model, ``0``
  none, or a comma list. Unset: ``0``. Why: on the H200 (session 42, EAGLE-3, prose at batch 1)
  the table read 0.34 ms per pass where a draft token left out saved about 0.18 ms of the
  step, and the controller drafted 3.15 tokens a step where K every step was 3% faster.
  Opt-in: on the H200 (session 43, EAGLE-3 at its best drafting length) it was no better than
  the pass-by-pass table.
- ``SPECDEC_ADAPTIVE_LENGTH_GAIN=<fraction>``: how much more throughput a longer drafting
  length must promise than the best shorter one (adaptive/policy.py), for every method. Unset:
  ``0`` for EAGLE-3 (the best drafting length; adaptive/config.py ``DEFAULT_LENGTH_GAIN`` says
  why), and for the other methods the 3% that drafting needs over a plain step. ``0.03``
  restores EAGLE-3's earlier rule.
- ``SPECDEC_ADAPTIVE_UNTESTED_DECAY=<fraction>``: how much of its evidence a draft position
  keeps at a step whose drafts did not reach it (adaptive/acceptance.py). Unset: the 0.95 of a
  tested position, so a longer draft is tried again about every 20-30 steps after it missed
  (EAGLE-3 at 3 or 4 drafts in 21% of its batch-1 steps at synthetic acceptance 3.0, H200,
  session 62). ``0.99``: about 4% in a CPU simulation. Opt-in until measured on a GPU.
- ``SPECDEC_ADAPTIVE_OBSERVED_ESTIMATOR=median|iqm``: how a draft length's observed/predicted
  step-time ratios become its correction: the median of the last 16 (default), or ``iqm``, the
  mean of their middle half (adaptive/observed_cost.py says why). Opt-in until measured on a
  GPU.
- ``SPECDEC_ADAPTIVE_RESUME_GAIN=<fraction>``: how much more throughput than a plain step
  drafting must promise before the adaptive controller, once off, drafts again (default 0.10;
  adaptive/policy.py, hysteresis). ``0`` restores the earlier rule (the same 3% either way).
- ``SPECDEC_ADAPTIVE_PROBE_BUDGET=<fraction>``: while the adaptive controller drafts nothing,
  its first probe comes after enough plain steps that the probe's extra time (priced as
  ``SPECDEC_ADAPTIVE_PROBE_COST`` says) is at most this share of theirs (default 0.005; never
  sooner than 16 steps; adaptive/controller.py). ``0``: the first probe after 16 plain steps
  at every batch size, as before.
- ``SPECDEC_ADAPTIVE_PROBE_COST=table|observed``: how the probe budget prices a probe: by the
  cost table's step verifying one draft per request (``table``), or by what the probes at that
  batch size were seen to cost in wall time, their drafting step and the drained step after
  them included (``observed``; adaptive/probe_cost.py). Unset: ``table``; the CUDA device
  layer sets ``observed`` (device/cuda.py says why). The CPU keeps ``table``: on a 2-core CPU
  (session 54, 5 and 8 rounds) neither price read apart from the other, with the same engine
  moving by up to half from round to round.
- ``SPECDEC_ADAPTIVE_PROTECT=<quantile>``: the adaptive controller drafts only where the
  request at this quantile of expected acceptance (0.25: the least accepting quarter's best)
  is expected to be no slower than with a plain step (adaptive/policy.py). Unset (default):
  off, the batch's expected throughput alone decides. Opt-in until measured on a GPU.
- ``SPECDEC_ADAPTIVE_SWITCH_GAIN=<fraction>``: while drafting, the adaptive controller keeps
  its draft length until another drafting length promises this much more throughput (0.03:
  3%; adaptive/policy.py). Unset (default): no hold, each step's best length by the
  shorter-first rule. Opt-in: on the H200 (session 40, EAGLE-3, batches 4-64) it did no
  better than the default.
- ``SPECDEC_ADAPTIVE_LENGTHS=<lengths>``: the draft lengths the adaptive controller may
  choose from, as a comma list of 0..K (``4``: K = 4 every step; ``0,4``: a plain step or K).
  Unset: every length 0..K. Unlike ``SPECDEC_ADAPTIVE=0`` the steps still go through our
  scheduler, so n-gram and suffix drafts keep their uniform (padded) lengths and full graphs:
  a "K every step" engine to set beside the adaptive one (session 60: ``SPECDEC_ADAPTIVE=0``
  ran n-gram and suffix 1.4-2.7x slower than plain decoding on real prompts, ragged and
  piecewise). Checked against K where the engine config is built.
- ``SPECDEC_ADAPTIVE_TABLE_LENGTHS=0|1|<methods>``: the start-up cost table also times the
  target at n*q tokens for every draft length (q = 2..K tokens per request, n = 1, 2, 4, ...
  requests), on graph devices above the request limit in each length's own full graph,
  instead of interpolating between n and n*(1+K) tokens (adaptive/measure.py): ``1`` every
  method, ``0`` none, or a comma list of methods. Unset: ``0``; the CUDA device layer sets
  ``eagle3``: on the H200 (session 40, SmolLM2 padded to 7B, batches 4-64) EAGLE-3 with it was
  within 1.022x of the better of plain decoding and K every step in all 8 cells, the
  interpolated table at worst 1.046x. Other methods are not yet measured with it.
- ``SPECDEC_NGRAM_ON_DEVICE=0|1``: where method "ngram" matches: ``1`` on the device (our
  ``ngram_match`` kernel over device-resident token histories, vLLM's ``ngram_gpu`` path, with
  async scheduling where the device has it), ``0`` on the host (our C++ index). Default: the
  device layer's choice (``DeviceLayer.ngram_on_device``: GPUs yes, the CPU no).
- ``SPECDEC_LEAN_PLAIN_STEPS=0``: run all of vLLM's async speculative bookkeeping after a step
  that verified no drafts too (the valid-token counts' host copy and the device correction of
  computed tokens), instead of leaving out what has nothing to do there
  (worker/plain_step_bookkeeping.py). Default on (left out).
- ``SPECDEC_FUSED_KV_WRITE=1``: write each attention layer's new K/V inside the attention
  kernel's launch (ops/paged_attention ``paged_attention_write_kv``; the platform then picks
  attention/backend.py's ``SpecDecFusedKVAttentionBackend``) instead of a separate
  ``reshape_and_cache`` launch per layer. Triton devices only. Opt-in: timed on the H100 in
  session 63 (EAGLE-3, synthetic 3.0) at 1.00x of the separate write, no gain.
  Read when a process first selects its attention backend (vLLM keeps that choice for the
  process's later engines).
- ``SPECDEC_SKINNY_GEMM=1``: on CUDA GPUs, products of at most 16 token rows in bfloat16 or
  float16 (linear layers and the LM head), and of 17-64 rows for the weights whose 64-row
  tile beat cuBLAS on the H100 (a 7B model's qkv, gate_up and LM head: a batch-16
  verification), run our Triton skinny GEMM (ops/skinny_gemm, patch P16,
  patches/gpu_linear.py) instead of cuBLAS. Off by default: timed on the H100 in session 65
  with the 16-row tile only, no gain in the engine (EAGLE-3 1.002x / 1.008x of the default
  at batch 1 / 16); the 64-row tile is not yet timed in an engine. Read once per worker
  process, before its model is built.
- ``SPECDEC_LEAN_STEP_INPUTS=0``: build a uniform speculative step's input ids and index
  tensors with vLLM's per-step uploads, instead of strided device copies and index tensors
  kept per batch shape (worker/uniform_step_inputs.py). Default on.
- ``SPECDEC_UNIFORM_DRAFTS=1``: pad the n-gram and suffix drafts of a step to the step's
  draft length with filler tokens (host proposers in the scheduler, the device n-gram path in
  the runner, which then neither trims nor waits for the match counts), so the verification
  step is a uniform decode batch that replays full graphs (adaptive/uniform_drafts.py). With
  adaptive drafting only. Opt-in until measured on a GPU.
- ``SPECDEC_SUFFIX_ASYNC=0|1|force``: method "suffix" under vLLM's async scheduling, which
  vLLM 0.26 turns off for it (spec_decode/suffix_async_config.py): drafts are made lazily, a
  step that drafts nothing never waits for the device (spec_decode/suffix_lazy.py). ``1``: on
  devices whose layer supports async scheduling (CUDA); ``force``: also where the device layer
  has no streams (the CPU: host stand-ins serialise everything; for tests). Unset: the device
  layer's ``suffix_async_default`` (``1`` on CUDA GPUs since session 22's H100 run, ``0``
  elsewhere). An explicit ``async_scheduling=False`` from the user wins.
- ``SPECDEC_SUFFIX_LATE_DRAFTS=1``: with ``SPECDEC_SUFFIX_ASYNC`` and uniform drafts, a step
  that verifies suffix drafts prepares its inputs first and waits for the previous step's
  tokens only just before the forward pass, where it writes the drafts into the prepared
  inputs (spec_decode/suffix_async_runner.py). Unset: ``1`` on CUDA GPUs (the device
  layer's process_env, since session 58's H200 run), ``0`` elsewhere.
- ``SPECDEC_CPU_LINEAR=auto|bf16w|fp32|bf16|torch``: weights of the linear layers and the LM
  head on CPU, packed once at load (device/cpu.py ``linear_packing``, per weight). ``auto``
  (default): weights whose values are all bfloat16 (a bfloat16 checkpoint, in float32 or
  bfloat16) as bfloat16 for our C++ kernel, widened to float32 in registers (lossless, half
  the bytes), any other weight for oneDNN in its own dtype; ``bf16w``: our kernel on bfloat16
  whatever the values (rounds weights that are not bfloat16 values); ``fp32``: oneDNN float32;
  ``bf16``: oneDNN bfloat16, activations rounded to bfloat16 too (greedy text differs from
  float32's, and speculation is no longer lossless: 1 and 1+K token products round
  differently); ``torch``: vLLM's ``F.linear`` on the unpacked weights.
- ``SPECDEC_JIT_BUILD=1``: compile csrc/ with torch's cpp_extension on first use when the
  installed package has no ``specdec_plugin._C`` (a source checkout not built by pip).
- ``SPECDEC_LOG_TRITON_COMPILES=1``: log every Triton compile in a worker, start-up included,
  with its whole specialisation key (worker/compile_log.py): to find which argument made a
  kernel compile again while serving. Default off.
- ``SPECDEC_STEP_LOG=PATH``: write a JSON line per engine-step event (scheduler, runner,
  drafter; host clock) to PATH, ``{pid}`` replaced by the process id (step_log.py): to
  find which steps of a slow run stalled and what they did. The events are held in memory
  and written when the engine process exits. Default off.
- ``SPECDEC_SYNC_DEBUG=warn|error``: once the engine has started (graphs captured, step
  costs timed), every call in a worker that makes the host wait for the device inside a copy
  or a read of a device value warns, with the place it was made from, once per place
  (``error``: raises instead), through the device's own sync-debug mode (CUDA:
  ``torch.cuda.set_sync_debug_mode``; worker/sync_debug.py): to find why a step's host work
  waits where async scheduling should let it run ahead. Waits on events are not reported
  (worker/sync_debug.py). Default off. Devices without such a mode (the CPU) log that they
  have none.
- ``SPECDEC_CACHE_DIR``: where ``specdec-models`` keeps checkpoints (default
  ``~/.cache/specdec_plugin/models``).
"""
from __future__ import annotations

import os

_TRUE = {"1", "true", "yes", "on"}


def disabled() -> bool:
    return os.environ.get("SPECDEC_DISABLE", "").strip().lower() in _TRUE


def forced_device() -> str | None:
    value = os.environ.get("SPECDEC_DEVICE", "").strip().lower()
    return value or None


def cpu_kv_cache_bytes() -> int:
    return int(float(os.environ.get("SPECDEC_CPU_KV_CACHE_GIB", "2")) * (1 << 30))


def cpu_threads() -> int:
    value = os.environ.get("SPECDEC_CPU_THREADS")
    if value:
        return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def drafter_graphs() -> bool:
    return os.environ.get("SPECDEC_DRAFTER_GRAPHS", "1").strip().lower() in _TRUE


def drafter_padding() -> bool:
    return os.environ.get("SPECDEC_DRAFTER_PADDING", "1").strip().lower() in _TRUE


def defer_drafter_sync() -> bool:
    # Unset: "0" here; the CPU and CUDA device layers set "1" in their process_env.
    return os.environ.get("SPECDEC_DEFER_DRAFTER_SYNC", "0").strip().lower() in _TRUE


def kv_only_flush() -> bool:
    return os.environ.get("SPECDEC_KV_ONLY_FLUSH", "1").strip().lower() in _TRUE


def recompute_drafter_block() -> bool:
    return os.environ.get("SPECDEC_RECOMPUTE_DRAFTER_BLOCK", "0").strip().lower() in _TRUE


def lean_plain_steps() -> bool:
    return os.environ.get("SPECDEC_LEAN_PLAIN_STEPS", "1").strip().lower() in _TRUE


def lean_step_inputs() -> bool:
    return os.environ.get("SPECDEC_LEAN_STEP_INPUTS", "1").strip().lower() in _TRUE


def uniform_drafts() -> bool:
    # Unset: "0" here; the CUDA device layer sets "1" in its process_env (graphs make padding
    # pay; on the CPU it only adds verification work).
    return os.environ.get("SPECDEC_UNIFORM_DRAFTS", "0").strip().lower() in _TRUE


def suffix_late_drafts() -> bool:
    # Unset: "0" here; the CUDA device layer sets "1" in its process_env (timed on the H200 in
    # session 58; spec_decode/suffix_async_runner.py says what it moves).
    return os.environ.get("SPECDEC_SUFFIX_LATE_DRAFTS", "0").strip().lower() in _TRUE


def log_triton_compiles() -> bool:
    return os.environ.get("SPECDEC_LOG_TRITON_COMPILES", "0").strip().lower() in _TRUE


def step_log_path() -> str | None:
    return os.environ.get("SPECDEC_STEP_LOG", "").strip() or None


def jit_build() -> bool:
    return os.environ.get("SPECDEC_JIT_BUILD", "0").strip().lower() in _TRUE


def model_cache_dir() -> str | None:
    return os.environ.get("SPECDEC_CACHE_DIR") or None


def adaptive_drafting() -> bool:
    return os.environ.get("SPECDEC_ADAPTIVE", "1").strip().lower() in _TRUE


def adaptive_observed_estimator() -> str:
    """The name as given (checked against adaptive/observed_cost.py's estimators where the
    config is built, adaptive/config.py)."""
    value = os.environ.get("SPECDEC_ADAPTIVE_OBSERVED_ESTIMATOR", "median").strip().lower()
    return value or "median"


def _method_list(raw: str) -> frozenset[str] | None:
    """A per-method switch's value: None for every method (``1``), the empty set for none
    (``0``, unset), else the comma list's names (checked where the config is built,
    adaptive/config.py)."""
    value = raw.strip().lower() or "0"
    if value in _TRUE:
        return None
    if value in ("0", "false", "no", "off"):
        return frozenset()
    return frozenset(name.strip() for name in value.split(",") if name.strip())


def adaptive_draft_graph_cost_methods() -> frozenset[str] | None:
    """The methods whose start-up table times drafting as the padded drafter graphs; None:
    every method. Unset: none."""
    return _method_list(os.environ.get("SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST", "0"))


def adaptive_observed_cost_methods() -> frozenset[str] | None:
    """The methods whose controller learns step costs; None: every method. Unset: none here;
    the CUDA device layer sets ``suffix`` in its process_env, the CPU one ``ngram,eagle3``."""
    return _method_list(os.environ.get("SPECDEC_ADAPTIVE_OBSERVED_COST", "0"))


def _number(name: str, raw: str, low: float, high: float, meaning: str,
            unset: str) -> float | None:
    """The float that variable ``name`` holds (``raw``), or None where unset. A bad value's
    error names the variable, its range and an example (adaptive/config.py reads these where
    the engine config is built). The callers read the environment themselves, by literal
    name, so that tests/test_envs.py sees every variable read."""
    raw = raw.strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:  # nan fails too
        raise ValueError(f"{name}={raw!r}: expected a number between {low:g} and {high:g}, "
                         f"{meaning}; {unset}")
    return value


def adaptive_resume_gain() -> float:
    from specdec_plugin.adaptive.policy import RESUME_GAIN

    value = _number("SPECDEC_ADAPTIVE_RESUME_GAIN",
                    os.environ.get("SPECDEC_ADAPTIVE_RESUME_GAIN", ""), 0.0, 10.0,
                    "such as 0.1 (drafting must promise 10% more tokens per second than a plain "
                    "step to resume)", f"unset it for the default {RESUME_GAIN}")
    return RESUME_GAIN if value is None else value


def adaptive_probe_budget() -> float:
    from specdec_plugin.adaptive.controller import PROBE_BUDGET

    value = _number("SPECDEC_ADAPTIVE_PROBE_BUDGET",
                    os.environ.get("SPECDEC_ADAPTIVE_PROBE_BUDGET", ""), 0.0, 1.0,
                    "such as 0.005 (probes may cost half a percent of the plain steps' time; 0: "
                    "a probe every 16 plain steps at first, whatever it costs)",
                    f"unset it for the default {PROBE_BUDGET}")
    return PROBE_BUDGET if value is None else value


PROBE_COST_CHOICES = ("table", "observed")


def adaptive_probe_cost() -> str:
    value = os.environ.get("SPECDEC_ADAPTIVE_PROBE_COST", "").strip().lower() or "table"
    if value not in PROBE_COST_CHOICES:
        raise ValueError(f"SPECDEC_ADAPTIVE_PROBE_COST={value!r}: expected one of "
                         f"{', '.join(PROBE_COST_CHOICES)} (observed: price probes by their "
                         "measured wall time; table: by the start-up cost table's verifying "
                         "step); unset it for the device's default")
    return value


def adaptive_protect() -> float | None:
    return _number("SPECDEC_ADAPTIVE_PROTECT", os.environ.get("SPECDEC_ADAPTIVE_PROTECT", ""),
                   0.0, 1.0,
                   "a quantile such as 0.25 (no draft length that would slow the least accepting "
                   "quarter of the batch)", "unset it to turn the protection off")


def adaptive_switch_gain() -> float | None:
    return _number("SPECDEC_ADAPTIVE_SWITCH_GAIN",
                   os.environ.get("SPECDEC_ADAPTIVE_SWITCH_GAIN", ""), 0.0, 10.0,
                   "such as 0.03 (another draft length must promise 3% more tokens per second "
                   "to replace the current one)", "unset it to choose the best length every step")


def adaptive_length_gain() -> float | None:
    return _number("SPECDEC_ADAPTIVE_LENGTH_GAIN",
                   os.environ.get("SPECDEC_ADAPTIVE_LENGTH_GAIN", ""), 0.0, 10.0,
                   "such as 0 (the best drafting length) or 0.01 (a longer draft must promise 1% "
                   "more tokens per second than a shorter one)",
                   "unset it for the default (EAGLE-3: 0; other methods: the 3% that drafting "
                   "needs over plain steps)")


def fused_kv_write() -> bool:
    return os.environ.get("SPECDEC_FUSED_KV_WRITE", "0").strip().lower() in _TRUE


def skinny_gemm() -> bool:
    return os.environ.get("SPECDEC_SKINNY_GEMM", "0").strip().lower() in _TRUE


def adaptive_untested_decay() -> float | None:
    return _number("SPECDEC_ADAPTIVE_UNTESTED_DECAY",
                   os.environ.get("SPECDEC_ADAPTIVE_UNTESTED_DECAY", ""), 0.5, 1.0,
                   "such as 0.99 (a draft position the step's drafts did not reach keeps 99% "
                   "of its evidence a step, so longer drafts are retried less often)",
                   "unset it to fade every position at the same rate (0.95 a step)")


def adaptive_lengths() -> tuple[int, ...] | None:
    """The draft lengths the adaptive controller may choose from, sorted; None where unset
    (every length 0..K). adaptive/config.py checks them against K."""
    raw = os.environ.get("SPECDEC_ADAPTIVE_LENGTHS", "").strip()
    if not raw:
        return None
    error = ValueError(f"SPECDEC_ADAPTIVE_LENGTHS={raw!r}: expected a comma list of draft "
                       "lengths from 0 to num_speculative_tokens, such as 4 (K = 4 every step) "
                       "or 0,4; unset it to let the controller choose from every length")
    try:
        lengths = tuple(sorted({int(part) for part in raw.split(",")}))
    except ValueError:
        raise error from None
    if lengths[0] < 0:
        raise error
    return lengths


def adaptive_table_length_methods() -> frozenset[str] | None:
    """The methods whose start-up table is timed at every draft length; None: every method.
    Unset: none here; the CUDA device layer sets ``eagle3`` in its process_env."""
    return _method_list(os.environ.get("SPECDEC_ADAPTIVE_TABLE_LENGTHS", "0"))


def ngram_on_device() -> bool | None:
    """None: unset, the device layer decides."""
    value = os.environ.get("SPECDEC_NGRAM_ON_DEVICE", "").strip().lower()
    return None if not value else value in _TRUE


SUFFIX_ASYNC_CHOICES = ("0", "1", "force")


def suffix_async(device_default: str = "0") -> str:
    """The variable's value; unset or empty, ``device_default`` (the device layer's
    ``suffix_async_default``: "1" on CUDA GPUs, "0" elsewhere)."""
    value = os.environ.get("SPECDEC_SUFFIX_ASYNC", "").strip().lower() or device_default
    if value in _TRUE:
        return "1"
    if value not in SUFFIX_ASYNC_CHOICES:
        raise ValueError(f"SPECDEC_SUFFIX_ASYNC={value!r}: expected one of {SUFFIX_ASYNC_CHOICES}")
    return value


SYNC_DEBUG_CHOICES = ("warn", "error")


def sync_debug() -> str | None:
    """None: off (unset, empty, ``0`` or ``off``)."""
    value = os.environ.get("SPECDEC_SYNC_DEBUG", "").strip().lower()
    if value in ("", "0", "off"):
        return None
    if value not in SYNC_DEBUG_CHOICES:
        raise ValueError(f"SPECDEC_SYNC_DEBUG={value!r}: expected one of "
                         f"{', '.join(SYNC_DEBUG_CHOICES)} (warn: each place that makes the "
                         "host wait for the device warns once); unset it to turn it off")
    return value


CPU_LINEAR_CHOICES = ("auto", "bf16w", "fp32", "bf16", "torch")


def cpu_linear() -> str:
    value = os.environ.get("SPECDEC_CPU_LINEAR", "auto").strip().lower() or "auto"
    if value not in CPU_LINEAR_CHOICES:
        raise ValueError(f"SPECDEC_CPU_LINEAR={value!r}: expected one of {CPU_LINEAR_CHOICES}")
    return value
