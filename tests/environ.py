"""Environment variables set for a block of a test, then restored (engine processes read them
when they start, so pytest's monkeypatch, undone only at the test's end, is not always what a
test wants)."""
from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def environ(**values: str):
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
