"""Per-request counts as rows of one preallocated array, found by request id.

Why: the acceptance tracker (``acceptance.py``) folds every request's verification result
into that request's counts once per engine step. Kept as one small numpy array per request,
each fold is several numpy calls of a few microseconds on a tiny array, and at batch 64 those
made most of the controller's host time per step. As rows of one array, a step's fold and the
batch's gather are one fancy-indexed operation each.

A row holds the request's tested counts and accepted counts, [2, K], so that one gather and
one scatter move both. A row is zero whenever it is free (``release`` clears it), so a new
request's first fold, ``old * decay + new``, gives exactly ``new``: what a fresh per-request
array gave.
"""
from __future__ import annotations

import numpy as np

INITIAL_ROWS = 64
TESTED, ACCEPTED = 0, 1


class RequestRows:
    def __init__(self, width: int, initial_rows: int = INITIAL_ROWS):
        self.width = width
        self.counts = np.zeros((initial_rows, 2, width))
        self.index: dict[str, int] = {}
        # Free rows, popped from the end: released rows first, then untouched ones from the
        # lowest up, so that the rows a batch gathers stay close together.
        self._free = list(range(initial_rows - 1, -1, -1))

    def row(self, req_id: str) -> int:
        """The request's row, allocated (zero) if it has none."""
        row = self.index.get(req_id)
        if row is None:
            if not self._free:
                self._grow()
            row = self._free.pop()
            self.index[req_id] = row
        return row

    def release(self, req_id: str) -> None:
        row = self.index.pop(req_id, None)
        if row is not None:
            self.counts[row] = 0.0
            self._free.append(row)

    def _grow(self) -> None:
        # Doubling: a server that admits more requests than the initial rows pays a copy a
        # handful of times, not per request.
        old = self.counts.shape[0]
        new = max(2 * old, 1)
        grown = np.zeros((new, 2, self.width))
        grown[:old] = self.counts
        self.counts = grown
        self._free.extend(range(new - 1, old - 1, -1))
