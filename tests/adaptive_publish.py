"""measure_and_publish (adaptive/measure.py) with a stand-in runner and engine config, and the
start-up cost table it writes: shared by the tests of what the table times."""
from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from specdec_plugin.adaptive import measure
from specdec_plugin.adaptive.config import _SCHEDULERS


def publish(monkeypatch, runner, method: str, k: int, use_eagle: bool = False) -> dict:
    """The table, as JSON fields, that rank 0 writes for an adaptive engine of ``method``
    with ``k`` drafts on ``runner``."""
    written = []
    monkeypatch.setattr(measure, "write_cost_table", lambda config, text: written.append(text))
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(scheduler_cls=_SCHEDULERS[True]),
        speculative_config=SimpleNamespace(num_speculative_tokens=k, method=method,
                                           use_eagle=lambda: use_eagle,
                                           uses_draft_model=lambda: False),
        model_config=SimpleNamespace(get_hidden_size=lambda: 8, dtype=torch.float32))
    measure.measure_and_publish(runner, config, rank=0, budget_s=60.0, sync=lambda: None)
    return json.loads(written[0])
