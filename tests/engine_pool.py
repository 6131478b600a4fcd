"""One vLLM ``LLM`` per distinct configuration, shared across the test session."""
from __future__ import annotations

import gc
import json
import os
import threading


# The environment an engine sees is frozen when its engine-core process starts. An engine in
# this process reads the live environment instead, so it runs here only while the variables
# that configure engines are as the pool's own builds left them (see `get`).
_CONFIG_PREFIXES = ("SPECDEC_", "VLLM_")
# Set by the pool itself around each build.
_SET_BY_POOL = ("SPECDEC_ADAPTIVE", "VLLM_ENABLE_V1_MULTIPROCESSING")


# Engine cores built in this process so far, by the pool or by a test itself (counted by
# `_count_engine_core_builds`). Two engine cores built here do not keep apart: in session 45's
# CI run an older one, used after a newer one was built, drafted differently
# (test_deferred_sync_engine.py) or scheduled forever (test_greedy_vs_transformers.py). So an
# engine of the pool built here serves only while it is the newest, and alone.
_engine_core_builds = 0


def _count_engine_core_builds() -> None:
    from vllm.v1.engine.core import EngineCore

    if getattr(EngineCore.__init__, "_counted_by_pool", False):
        return
    build = EngineCore.__init__

    def counted(self, *args, **kwargs):
        global _engine_core_builds
        _engine_core_builds += 1
        build(self, *args, **kwargs)

    counted._counted_by_pool = True
    EngineCore.__init__ = counted


def _engine_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items()
            if name.startswith(_CONFIG_PREFIXES) and name not in _SET_BY_POOL}


class EnginePool:
    # Keep at most this many engines alive (each holds a model and a KV cache in memory).
    MAX_ALIVE = 4

    def __init__(self) -> None:
        self._environment = _engine_environment()
        self._engines: dict[str, object] = {}
        self._created = 0
        self._newest: str | None = None
        # Engines asked for with metrics=True: once another engine is built they can only be
        # rebuilt for their counters, so they are the first to go when the pool is full.
        self._metrics_keys: set[str] = set()
        # Plain greedy outputs by (model, prompts, max_tokens): see `plain_greedy`.
        self._plain_outputs: dict[str, list[list[int]]] = {}
        # (prompts, max_tokens) the session's modules will ask `plain_greedy` for: see there.
        self._plain_wanted: list[tuple[list[str], int]] = []
        # How often each alive engine was asked for: see `get`.
        self._uses: dict[str, int] = {}
        # Shutdowns of engine processes still under way (see `_shutdown`).
        self._stopping: list[threading.Thread] = []
        # Engines built in this process: the count of engine cores built here once each was.
        self._built_at: dict[str, int] = {}

    def get(self, model: str, metrics: bool = False, adaptive: bool = False,
            in_process: bool | None = None, **kwargs):
        """The engine for this configuration. ``metrics=True``: the caller reads its counters
        from ``LLM.get_metrics()``. Every new engine's Prometheus logger unregisters the vLLM
        metrics of the engines before it (vllm/v1/metrics/loggers.py), so such an engine must
        be the newest one: an older one is rebuilt. ``adaptive=True``: with the adaptive
        draft-length controller (off by default in tests, see conftest.py).

        ``in_process``: build the engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
        rather than in an engine-core process of its own. On 2 cores that builds an engine in
        7-14 s instead of 24-31 (session 45, SmolLM2 plain, n-gram and EAGLE-3: a process of
        its own imports torch and vLLM again before it builds anything). The default
        (None) builds here when every ``SPECDEC_*`` and ``VLLM_*`` variable is as the pool's
        own builds left it (a build writes some: the device layer's defaults, vLLM's
        multiprocessing method), and in a process of its own where a test set one: some
        settings are read after the build, and only a process of its own keeps the environment
        of its build. A test whose variables are all read while the engine is built may pass True.
        What users run, an engine core in its own process, stays covered by every test that
        starts ``vllm serve`` or builds ``LLM`` itself."""
        from vllm import LLM

        kwargs.setdefault("dtype", "float32")
        kwargs.setdefault("max_model_len", 1024)
        kwargs.setdefault("seed", 0)
        if in_process is None:
            in_process = _engine_environment() == self._environment
        key = json.dumps({"model": model, "adaptive": adaptive, "in_process": in_process, **kwargs},
                         sort_keys=True, default=str)
        if metrics and key in self._engines and key != self._newest:
            self._shutdown(key)
        if key in self._built_at and self._built_at[key] != _engine_core_builds:
            self._shutdown(key)  # built here, and another engine core since: rebuilt below
        if key not in self._engines:
            while len(self._engines) >= self.MAX_ALIVE:
                # Least recently used first, metrics engines before the others, and engines
                # asked for once (tiny models, one module's configuration) before those asked
                # for again: the plain engine many modules share is not rebuilt after a run of
                # one-off engines (test_tiny_architectures.py) pushed it out.
                self._shutdown(min(self._engines, key=lambda k: (k not in self._metrics_keys,
                                                                  self._uses[k] > 1)))
            # Engines share this process's metrics registry; a distinct served name labels
            # each engine's counters (see `counters`).
            self._created += 1
            # The controller is chosen from the environment when the config is built.
            saved = {name: os.environ.get(name) for name in _SET_BY_POOL}
            os.environ["SPECDEC_ADAPTIVE"] = "1" if adaptive else "0"
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
            if in_process:
                _count_engine_core_builds()
                for other in list(self._built_at):
                    self._shutdown(other)
            before = _engine_environment()
            try:
                self._engines[key] = LLM(model=model, served_model_name=f"pool-{self._created}", **kwargs)
                self._environment.update({name: value for name, value in _engine_environment().items()
                                          if before.get(name) != value})
            finally:
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
                if in_process:
                    _undo_engine_core_process_settings()
            if in_process:
                self._built_at[key] = _engine_core_builds
            self._newest = key
            if metrics:
                self._metrics_keys.add(key)
        else:  # most recently used last
            self._engines[key] = self._engines.pop(key)
        self._uses[key] = self._uses.get(key, 0) + 1
        return self._engines[key]

    def _shutdown(self, key: str) -> None:
        """Drop the engine. Its engine-core process takes about 3 s to exit after SIGTERM
        (vLLM's client joins it), time in which the next engine can already be built: an
        engine in its own process is stopped in a thread, waited for at `close`."""
        llm = self._engines.pop(key)
        self._built_at.pop(key, None)
        self._metrics_keys.discard(key)
        self._uses.pop(key, None)
        if key == self._newest:
            self._newest = None
        engine = getattr(llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None:
            # vLLM's own engine monitor calls this shutdown from a thread of its own too.
            if hasattr(core, "resources"):  # MPClient: the engine core is a process
                thread = threading.Thread(target=core.shutdown, name=f"stop-{key[:40]}",
                                          daemon=True)
                thread.start()
                self._stopping = [t for t in self._stopping if t.is_alive()] + [thread]
            else:  # the engine in this process
                core.shutdown()
        del llm, engine, core
        gc.collect()

    def want_plain_greedy(self, prompts, max_tokens: int) -> None:
        """Announce that ``plain_greedy`` will be asked for these (any model): the first call
        for a model then computes all of them while its plain engine is there (the MTP
        target's is pushed out between test_adaptive_engine.py and test_spec_decode_greedy.py,
        and a rebuild costs 15-30 s on 2 cores). conftest.py announces each selected module's
        ``PLAIN_GREEDY_BASELINES``."""
        if (list(prompts), max_tokens) not in self._plain_wanted:
            self._plain_wanted.append((list(prompts), max_tokens))

    def plain_greedy(self, model: str, prompts, max_tokens: int) -> list[list[int]]:
        """Greedy token ids of ``model`` without speculation (prefix caching off, EOS
        ignored), computed once per session: the engines built in between may push the plain
        one out of the pool, and a rebuild costs 10-20 s on 2 cores. Each set of prompts is
        one ``generate`` call of its own, whether asked for now or announced
        (``want_plain_greedy``)."""
        from vllm import SamplingParams

        key = json.dumps([model, list(prompts), max_tokens])
        if key not in self._plain_outputs:
            llm = self.get(model, enable_prefix_caching=False)
            for some_prompts, some_max in [(list(prompts), max_tokens), *self._plain_wanted]:
                some_key = json.dumps([model, some_prompts, some_max])
                if some_key in self._plain_outputs:
                    continue
                params = SamplingParams(temperature=0.0, max_tokens=some_max, ignore_eos=True)
                self._plain_outputs[some_key] = [list(o.outputs[0].token_ids)
                                                 for o in llm.generate(some_prompts, params)]
        return self._plain_outputs[key]

    def close(self) -> None:
        # All at once: each engine process exits in about 3 s of its own.
        for key in list(self._engines):
            self._shutdown(key)
        for thread in self._stopping:
            thread.join()
        self._stopping.clear()


def _undo_engine_core_process_settings() -> None:
    """An engine core started in this process set two things meant for a process of its own
    (vllm/v1/engine/core.py): vLLM's environment cache, which would hide every later test's
    ``setenv`` of a ``VLLM_*`` variable, and ``gc.freeze()``, after which the cycles of the
    engines dropped later are never collected."""
    from vllm import envs

    envs.disable_envs_cache()
    gc.unfreeze()


def counters(llm, prefixes=("vllm:spec_decode", "vllm:num_preemptions")) -> dict:
    """This engine's counters (by metric name) from ``LLM.get_metrics()``."""
    name = llm.llm_engine.model_config.served_model_name
    out = {}
    for metric in llm.get_metrics():
        if metric.name.startswith(prefixes) and metric.labels.get("model_name") == name:
            out[metric.name] = getattr(metric, "values", None) or getattr(metric, "value", None)
    return out


def counter_delta(before: dict, after: dict, name: str):
    """How much counter ``name`` grew between two ``counters`` snapshots (lists elementwise)."""
    new, old = after.get(name, 0), before.get(name)
    if isinstance(new, list):
        old = old or [0] * len(new)
        return [a - b for a, b in zip(new, old)]
    return new - (old or 0)
