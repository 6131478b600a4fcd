"""Token shards: what the generation stage writes and the training stage reads.

One shard is an ``.npz`` with, for N sequences (prompt + the target's answer):
- ``tokens``      int32 [T]: every sequence's tokens, one after the other;
- ``offsets``     int64 [N + 1]: sequence i is ``tokens[offsets[i]:offsets[i + 1]]``;
- ``prompt_lens`` int32 [N]; ``greedy`` bool [N] (False: sampled at T=0.7);
- ``category``    uint8 [N]: index into ``prompt_sources.CATEGORIES``.
Shards are written atomically (``.tmp`` then rename), so a stage stopped mid-write leaves only
whole shards. ``heldout.npz`` holds greedy answers to held-out prompts (agreement evaluation in
the training stage); ``train-*.npz`` everything else.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

HELDOUT_NAME = "heldout.npz"


class ShardWriter:
    def __init__(self, out_dir: Path, prefix: str = "train"):
        self.out_dir, self.prefix = Path(out_dir), prefix
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.index = len(list(self.out_dir.glob(f"{prefix}-*.npz")))
        self.rows: list[tuple[list[int], int, bool, int]] = []
        self.pending_tokens = 0
        self.written_tokens = 0
        self.written_sequences = 0

    def add(self, tokens: list[int], prompt_len: int, greedy: bool, category: int) -> None:
        self.rows.append((tokens, prompt_len, greedy, category))
        self.pending_tokens += len(tokens)

    def flush(self, name: str | None = None) -> Path | None:
        if not self.rows:
            return None
        if name is None:
            name = f"{self.prefix}-{self.index:05d}.npz"
            self.index += 1
        path = self.out_dir / name
        write_shard(path, self.rows)
        self.written_tokens += self.pending_tokens
        self.written_sequences += len(self.rows)
        self.rows, self.pending_tokens = [], 0
        return path


def write_shard(path: Path, rows) -> None:
    lengths = np.array([len(r[0]) for r in rows], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.fromiter((t for r in rows for t in r[0]), dtype=np.int32, count=int(offsets[-1]))
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "wb") as handle:
        np.savez(handle, tokens=tokens, offsets=offsets,
                 prompt_lens=np.array([r[1] for r in rows], dtype=np.int32),
                 greedy=np.array([r[2] for r in rows], dtype=bool),
                 category=np.array([r[3] for r in rows], dtype=np.uint8))
    os.replace(tmp, path)


def read_shards(paths) -> dict:
    """All given shards as one set of arrays (offsets re-based)."""
    parts = [np.load(p) for p in sorted(paths)]
    if not parts:
        raise FileNotFoundError("no shards")
    tokens, offsets, base = [], [np.zeros(1, dtype=np.int64)], 0
    for part in parts:
        tokens.append(part["tokens"])
        offsets.append(part["offsets"][1:] + base)
        base += int(part["offsets"][-1])
    out = {"tokens": np.concatenate(tokens), "offsets": np.concatenate(offsets)}
    for key in ("prompt_lens", "greedy", "category"):
        out[key] = np.concatenate([p[key] for p in parts])
    return out


def train_shards(data_dir: Path) -> list[Path]:
    return sorted(Path(data_dir).glob("train-*.npz"))
