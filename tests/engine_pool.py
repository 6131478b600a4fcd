"""One vLLM ``LLM`` per distinct configuration, shared across the test session."""
from __future__ import annotations

import contextlib
import gc
import json
import threading
import time


# Every test engine's settings unless the test gives its own.
ENGINE_DEFAULTS = {"dtype": "float32", "max_model_len": 1024, "seed": 0}


class EnginePool:
    # Keep at most this many engines alive (each holds a model and a KV cache in memory).
    MAX_ALIVE = 4
    # Each engine's core runs in a process of its own, as users run it. Built in this process
    # (VLLM_ENABLE_V1_MULTIPROCESSING=0), a SmolLM2 engine starts in 7-14 s instead of 24-31 s
    # on 2 cores (session 45), but several engine cores alive in one process did not keep
    # apart in a CI run: comparisons of test_deferred_sync_engine.py with the pool's plain
    # engine failed, and an engine of test_greedy_vs_transformers.py scheduled for 14 minutes
    # without end. A cause of the failures, found after (whether of the hang too is not
    # known): vLLM's parallel state (the torch.distributed groups) belongs to the process, so
    # shutting one engine built here down takes it from every other (engine A alive, engine B
    # built, used and shut down: A.generate then fails with "pipeline model parallel group is
    # not initialized"). The rule `one_off` keeps (session 50): one engine built here at a
    # time, others in processes of their own, and that one used only while no engine core was
    # built or shut down here since (test_deferred_sync_engine.py's engines keep it too). See
    # session 45's closing note.

    def __init__(self) -> None:
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
        # (configuration, seconds to build) of every engine built, for the end-of-run summary
        # (conftest.py): engine starts are most of CI's time.
        self.built: list[tuple[str, float]] = []

    def get(self, model: str, metrics: bool = False, adaptive: bool = False, **kwargs):
        """The engine for this configuration. ``metrics=True``: the caller reads its counters
        from ``LLM.get_metrics()``. Every new engine's Prometheus logger unregisters the vLLM
        metrics of the engines before it (vllm/v1/metrics/loggers.py), so such an engine must
        be the newest one: an older one is rebuilt. ``adaptive=True``: with the adaptive
        draft-length controller (off by default in tests, see conftest.py)."""
        kwargs = {**ENGINE_DEFAULTS, **kwargs}
        key = json.dumps({"model": model, "adaptive": adaptive, **kwargs}, sort_keys=True, default=str)
        if metrics and key in self._engines and key != self._newest:
            self._shutdown(key)
        if key not in self._engines:
            while len(self._engines) >= self.MAX_ALIVE:
                # Least recently used first, metrics engines before the others, and engines
                # asked for once (tiny models, one module's configuration) before those asked
                # for again: the plain engine many modules share is not rebuilt after a run of
                # one-off engines (test_tiny_architectures.py) pushed it out.
                self._shutdown(min(self._engines, key=lambda k: (k not in self._metrics_keys,
                                                                  self._uses[k] > 1)))
            self._engines[key] = self._build(key, model, adaptive, **kwargs)
            self._newest = key
            if metrics:
                self._metrics_keys.add(key)
        else:  # most recently used last
            self._engines[key] = self._engines.pop(key)
        self._uses[key] = self._uses.get(key, 0) + 1
        return self._engines[key]

    @contextlib.contextmanager
    def one_off(self, model: str, adaptive: bool = False, **kwargs):
        """An engine for one test alone, built in this process and shut down when the block
        ends. In this process an engine starts 10-20 s sooner on 2 cores (no engine process to
        spawn, which imports vLLM and torch again: session 50 measured adaptive engines' tests
        at 19 s instead of 36-45, an EAGLE engine at about 9 s less), and the rule that
        keeps such engines apart holds here: one at a time, and none alive when another
        engine of this process is built or shut down (see the class comment). Nothing else in
        the session can reuse it, so use it for configurations one test asks for. Its
        counters are read as a pool engine's (``counters``)."""
        kwargs = {**ENGINE_DEFAULTS, **kwargs}
        key = json.dumps({"model": model, "adaptive": adaptive, "one_off": True, **kwargs},
                         sort_keys=True, default=str)
        llm = self._build(key, model, adaptive, in_process=True, **kwargs)
        # Its Prometheus logger unregistered the pool's engines' metrics (see `get`).
        self._newest = None
        try:
            yield llm
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()

    def _build(self, key: str, model: str, adaptive: bool, in_process: bool = False, **kwargs):
        """A new ``LLM``, timed for the end-of-run summary. ``in_process``: its engine core in
        this process rather than one of its own."""
        from vllm import LLM

        from tests.environ import environ

        # The controller is chosen from the environment when the config is built.
        env = {"SPECDEC_ADAPTIVE": "1" if adaptive else "0"}
        if in_process:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # Engines share this process's metrics registry; a distinct served name labels each
        # engine's counters (see `counters`).
        self._created += 1
        started = time.perf_counter()
        with environ(**env):
            llm = LLM(model=model, served_model_name=f"pool-{self._created}", **kwargs)
        self.built.append((key, time.perf_counter() - started))
        return llm

    def _shutdown(self, key: str) -> None:
        """Drop the engine. Its engine-core process takes about 3 s to exit after SIGTERM
        (vLLM's client joins it), time in which the next engine can already be built: an
        engine in its own process is stopped in a thread, waited for at `close`."""
        llm = self._engines.pop(key)
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
