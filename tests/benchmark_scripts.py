"""Load a script of benchmarks/ as a module, for the tests that check its bookkeeping (the
directory is not a package: its scripts run as ``python benchmarks/NAME.py``)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
