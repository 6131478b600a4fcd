"""One vLLM ``LLM`` per distinct configuration, shared across the test session."""
from __future__ import annotations

import gc
import json


class EnginePool:
    # Keep at most this many engines alive (each holds a model and a KV cache in memory).
    MAX_ALIVE = 4

    def __init__(self) -> None:
        self._engines: dict[str, object] = {}

    def get(self, model: str, **kwargs):
        from vllm import LLM

        kwargs.setdefault("dtype", "float32")
        kwargs.setdefault("max_model_len", 1024)
        kwargs.setdefault("seed", 0)
        key = json.dumps({"model": model, **kwargs}, sort_keys=True, default=str)
        if key not in self._engines:
            while len(self._engines) >= self.MAX_ALIVE:
                self._shutdown(next(iter(self._engines)))
            self._engines[key] = LLM(model=model, **kwargs)
        else:  # most recently used last
            self._engines[key] = self._engines.pop(key)
        return self._engines[key]

    def _shutdown(self, key: str) -> None:
        llm = self._engines.pop(key)
        engine = getattr(llm, "llm_engine", None)
        if engine is not None and hasattr(engine, "engine_core"):
            engine.engine_core.shutdown()
        del llm
        gc.collect()

    def close(self) -> None:
        for key in list(self._engines):
            self._shutdown(key)
