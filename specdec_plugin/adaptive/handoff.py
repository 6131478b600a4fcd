"""Where the worker leaves the cost table it measured for the scheduler to read.

The worker measures at engine start (after graph capture, before the scheduler exists) and
the scheduler reads once when it is built: both run on the same host and see the same
``VllmConfig``, whose ``instance_id`` names the file. A file, because the scheduler and the
workers may be different processes (multiprocess executor) and vLLM has no channel from
worker to scheduler for facts like this.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cost_table_path(vllm_config) -> Path:
    # Not "specdec_plugin": a script run from the temp folder would import that as our package.
    folder = Path(tempfile.gettempdir()) / "specdec_plugin_costs"
    return folder / f"costs-{vllm_config.instance_id or 'default'}.json"


def write_cost_table(vllm_config, text: str) -> Path:
    path = cost_table_path(vllm_config)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def read_cost_table(vllm_config) -> str | None:
    path = cost_table_path(vllm_config)
    try:
        return path.read_text()
    except OSError:
        return None
