"""The kernel registry and its tests stay in step: every op in ``specdec_plugin/ops/registry.py``
has its test module ``tests/ops/test_<folder>.py`` (folder = the ``ops/<folder>/`` package that
implements it), whose registry-driven comparison covers it, and every folder has the validator
its providers call. A new op, or a new folder, without these fails here."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from specdec_plugin.ops.registry import KERNELS, get_kernel, op_folder

TESTS = Path(__file__).parent
OPS = Path(importlib.import_module("specdec_plugin.ops").__file__).parent


@pytest.mark.parametrize("op", sorted(KERNELS))
def test_every_op_has_its_test_module(op):
    folder = op_folder(op)
    assert (OPS / folder / "__init__.py").exists(), f"{op}: no package ops/{folder}/"
    assert (OPS / folder / "validate.py").exists(), f"{op}: ops/{folder}/ has no validate.py"
    path = TESTS / f"test_{folder}.py"
    assert path.exists(), f"{op} has no test module {path.relative_to(TESTS.parent.parent)}"
    module = importlib.import_module(f"tests.ops.test_{folder}")
    assert getattr(module, "FOLDER", None) == folder
    assert op in getattr(module, "CASES", {}), f"{path.name} has no CASES[{op!r}]"
    assert callable(getattr(module, "test_provider_matches_reference", None))


@pytest.mark.parametrize("op", sorted(KERNELS))
def test_every_provider_resolves(op):
    """Every "module:function" in the table exists (Triton's import under the interpreter)."""
    assert "torch" in KERNELS[op], f"{op} has no torch reference"
    for provider in KERNELS[op]:
        assert callable(get_kernel(op, (provider,)))


def test_every_ops_folder_is_registered():
    folders = {p.parent.name for p in OPS.glob("*/__init__.py")}
    assert folders == {op_folder(op) for op in KERNELS}
