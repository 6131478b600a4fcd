"""The target's hidden states for one training batch, recomputed on the fly (never stored).

At millions of tokens the features EAGLE-3 needs (3 x 576 + 576 values per token) would not
fit a device call's disk and memory budget; one bf16 forward of the 135M target costs about
as much as one drafter step, so each batch is run through the target again.

``TargetFeatures(model)(tokens, lengths, prompt_lens)`` returns the dict the training losses
read (``train.slice_batch``'s keys): ``tokens``, ``lengths``, ``prompt_lens``, ``pre`` (final
residual stream before the last norm), ``post`` (after it), ``aux`` (residual stream after
layers 2, 15, 27: vLLM's EAGLE-3 taps for a 30-layer model). Batches are right-padded and the
model is causal, so padding never reaches a real position.
"""
from __future__ import annotations

import numpy as np
import torch

from training.data import AUX_LAYERS, PAD_TOKEN, target_norm


class TargetFeatures:
    """``aux_layers``: the EAGLE-3 head's taps, "after k layers" (vLLM's numbering: k = the
    target's layer count is the residual stream after its last layer, before the final norm)."""

    def __init__(self, model, dtype, aux_layers=AUX_LAYERS):
        self.model, self.dtype = model, dtype
        self.device = next(model.parameters()).device
        layers = model.model.layers
        self.last = len(layers) - 1
        if not all(1 <= k <= len(layers) for k in aux_layers):
            raise ValueError(f"taps {list(aux_layers)}: each must lie in 1..{len(layers)} "
                             "(after that many target layers)")
        self.taps = [k - 1 for k in aux_layers]  # "after k layers" = output of layer k-1
        self.captured: dict[int, torch.Tensor] = {}
        self._handles = [layers[i].register_forward_hook(self._hook(i))
                         for i in set(self.taps) | {self.last}]

    def close(self) -> None:
        """Remove the hooks (a second TargetFeatures on the same model would double them)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, index):
        def hook(_module, _inputs, output):
            self.captured[index] = output[0] if isinstance(output, tuple) else output
        return hook

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor, prompt_lens: torch.Tensor):
        self.captured.clear()
        self.model.model(input_ids=tokens, use_cache=False)
        pre = self.captured[self.last].to(self.dtype)
        aux = torch.cat([self.captured[i].to(self.dtype) for i in self.taps], dim=-1)
        self.captured.clear()
        return {"tokens": tokens, "lengths": lengths, "prompt_lens": prompt_lens, "pre": pre,
                "post": target_norm(self.model, pre), "aux": aux}


def pad_rows(seqs: list[np.ndarray], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded [B, max_len] token tensor and the lengths."""
    width = max(len(s) for s in seqs)
    tokens = np.full((len(seqs), width), PAD_TOKEN, dtype=np.int64)
    for row, s in enumerate(seqs):
        tokens[row, : len(s)] = s
    return (torch.from_numpy(tokens).to(device),
            torch.tensor([len(s) for s in seqs], device=device))


class ShardBatches:
    """Batches of similar-length sequences under a token budget (rows x longest <= budget),
    reshuffled every epoch; sequences longer than ``max_len`` are cut to it."""

    def __init__(self, shard: dict, token_budget: int, max_len: int, max_rows: int, seed: int = 0):
        self.shard, self.max_len = shard, max_len
        offsets = shard["offsets"]
        lengths = np.minimum(offsets[1:] - offsets[:-1], max_len)
        order = np.argsort(lengths, kind="stable")
        self.chunks, current = [], []
        for i in order:
            full = (len(current) + 1) * lengths[i] > token_budget or len(current) >= max_rows
            if current and full:
                self.chunks.append(current)
                current = []
            current.append(int(i))
        if current:
            self.chunks.append(current)
        self.rng = np.random.default_rng(seed)
        self.queue: list[list[int]] = []
        self.epoch = 0
        self.tokens_per_epoch = int(lengths.sum())

    def next_rows(self) -> list[int]:
        if not self.queue:
            self.queue = [self.chunks[i] for i in self.rng.permutation(len(self.chunks))]
            self.epoch += 1
        return self.queue.pop()

    def rows_to_batch(self, rows: list[int], device):
        tok, off = self.shard["tokens"], self.shard["offsets"]
        seqs = [tok[off[r]: min(off[r + 1], off[r] + self.max_len)] for r in rows]
        tokens, lengths = pad_rows(seqs, device)
        prompt_lens = torch.tensor(self.shard["prompt_lens"][rows].astype(np.int64), device=device)
        return tokens, lengths, prompt_lens
