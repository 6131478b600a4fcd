"""The drafter's inputs padded to a few fixed shapes, so its graphs are recorded at start-up.

Why: keyed by the exact batch shape (drafter_graphs.py), a drafter graph is recorded the first
time a shape is met, inside a live step: a server stalls tens of milliseconds at each new
batch size, and an adaptive engine, whose draft length changes the shapes, meets new ones all
the time (measured on the H100, 2026-11-25: adaptive EAGLE-3 1.05-1.10x slower than K every
step at batch 16 and 64, the difference being these recordings). Here every decode-sized
EAGLE / EAGLE-3 / MTP step is padded to ``P`` requests of exactly ``1+K`` tokens, ``P`` the
smallest of :func:`request_buckets` that holds the batch (the layout: ``ops/drafter_pad``), so
the keys are (draft length, P) and all of them are recorded when the engine starts.

One set of input buffers, sized for the largest bucket, serves every padded graph: the graphs
replay one after another, so each reads the first ``P`` rows of the same tensors.

The draft model is padded the same way (``next_token_slot``). vLLM's draft-model pass inserts
the next token after each request's real tokens and treats the tokens after it as rejected
(its ``copy_and_expand_eagle_inputs_kernel``): our fillers are counted as rejected tokens, so
they become rejected slots there, which write no KV. A filler request's one valid token and
its inserted slot sit at ``max_model_len - 2`` and ``- 1`` and write their KV into block 0,
vLLM's null block, which no request reads (vLLM recomputes the draft model's slots from the
block table, so our filler slot of -1 does not reach it). Until session 25 the draft
model recorded exact-shape graphs while serving instead (15 per engine on the H100, session 13).

Not padded (the exact-shape graphs, or eager drafting, as before): other drafters that insert
slots (parallel drafting, DFlash), and steps whose longest sequence is within 1+K tokens of
``max_model_len`` (the fillers would reach past the block table).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from vllm.v1.attention.backend import CommonAttentionMetadata


def request_buckets(max_reqs: int) -> list[int]:
    """Padded request counts: powers of two and the midpoints between them (at most 1.5x
    padding past 2), then ``max_reqs`` itself."""
    sizes, n = {max_reqs}, 1
    while n < max_reqs:
        sizes.update(s for s in (n, n + n // 2) if s <= max_reqs)
        n *= 2
    return sorted(sizes)


class PaddedDraftInputs:
    """Static inputs of the padded drafter graphs, and the ``propose`` call that reads them."""

    def __init__(self, max_reqs: int, query_len: int, hidden_width: int,
                 hidden_dtype: torch.dtype, block_width: int, max_model_len: int,
                 device: torch.device, pad_kernel, next_token_slot: bool = False) -> None:
        self.buckets = request_buckets(max_reqs)
        self.query_len = query_len
        self.hidden_width = hidden_width
        self.hidden_dtype = hidden_dtype
        self.max_model_len = max_model_len
        # Where a filler request sits: at the last position, so that vLLM's draft steps step
        # past max_model_len, which it clamps and masks. With an inserted slot (the draft
        # model) one lower: the slot takes the next position, which must stay in the rotary
        # table (vLLM gives its rejected slots position 0).
        self.fake_position = max_model_len - 1 - int(next_token_slot)
        self._pad = pad_kernel
        rows, reqs = max_reqs * query_len, max_reqs

        def ints(*shape, dtype=torch.int32):
            return torch.zeros(shape, dtype=dtype, device=device)

        # dtypes as vLLM's runner passes them (its input ids are int32, positions int64).
        self.token_ids, self.positions = ints(rows), ints(rows, dtype=torch.int64)
        self.slot_mapping = ints(rows, dtype=torch.int64)
        self.hidden_states = torch.zeros(rows, hidden_width, dtype=hidden_dtype, device=device)
        self.next_token_ids, self.token_indices_to_sample = ints(reqs), ints(reqs)
        self.num_rejected, self.seq_lens = ints(reqs), ints(reqs)
        self.block_table = ints(reqs, block_width)
        starts = torch.arange(reqs + 1, dtype=torch.int32) * query_len
        self.query_start_loc, self.query_start_loc_cpu = starts.to(device), starts

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (
            self.token_ids, self.positions, self.slot_mapping, self.hidden_states,
            self.next_token_ids, self.token_indices_to_sample, self.num_rejected,
            self.seq_lens, self.block_table, self.query_start_loc))

    def bucket(self, num_reqs: int) -> int | None:
        return next((b for b in self.buckets if b >= num_reqs), None)

    def fits(self, kwargs: dict[str, Any]) -> bool:
        """Whether a live ``propose`` call can be padded (host values only, no sync)."""
        cad = kwargs["common_attn_metadata"]
        hidden = kwargs["target_hidden_states"]
        return (cad.max_query_len <= self.query_len
                and cad.max_seq_len + self.query_len <= self.max_model_len
                and self.bucket(cad.batch_size()) is not None
                and hidden.dim() == 2 and hidden.shape[1] == self.hidden_width
                and hidden.dtype == self.hidden_dtype)

    def fill(self, kwargs: dict[str, Any] | None, padded_reqs: int) -> None:
        """Write one step's inputs (None: fillers only, for a recording at start-up) into the
        first ``padded_reqs`` rows."""
        rows = padded_reqs * self.query_len
        outputs = (self.token_ids[:rows], self.positions[:rows], self.hidden_states[:rows],
                   self.next_token_ids[:padded_reqs],
                   self.token_indices_to_sample[:padded_reqs],
                   self.num_rejected[:padded_reqs], self.seq_lens[:padded_reqs],
                   self.block_table[:padded_reqs], self.slot_mapping[:rows])
        if kwargs is None:
            kwargs = self._no_requests()
        cad = kwargs["common_attn_metadata"]
        self._pad(kwargs["target_token_ids"], kwargs["target_positions"],
                  kwargs["target_hidden_states"], kwargs["next_token_ids"],
                  kwargs["token_indices_to_sample"], kwargs["num_rejected_tokens_gpu"],
                  cad.query_start_loc, cad.seq_lens, cad.block_table_tensor, cad.slot_mapping,
                  *outputs, query_len=self.query_len, fake_position=self.fake_position)

    def compile_kernel_variants(self) -> None:
        """Launch the pad kernel now in both variants serving uses: vLLM passes the sampled
        indices and rejected counts on most steps and None on some (a compile in the middle of
        serving stalls that step; seen on the H100, 2026-11-25)."""
        for optional_inputs in (False, True):
            self.fill(self._no_requests(optional_inputs), 1)

    def _no_requests(self, optional_inputs: bool = False) -> dict[str, Any]:
        empty = self.token_ids[:0]
        cad = SimpleNamespace(query_start_loc=self.query_start_loc[:1], seq_lens=empty,
                              block_table_tensor=self.block_table[:0], slot_mapping=self.slot_mapping[:0])
        return {"target_token_ids": empty, "target_positions": self.positions[:0],
                "target_hidden_states": self.hidden_states[:0], "next_token_ids": empty,
                "token_indices_to_sample": empty if optional_inputs else None,
                "num_rejected_tokens_gpu": empty if optional_inputs else None,
                "common_attn_metadata": cad}

    def propose_kwargs(self, padded_reqs: int, k: int) -> dict[str, Any]:
        """vLLM ``propose`` arguments reading the buffers. A fresh metadata object each time:
        ``propose`` reassigns its fields as it drafts."""
        rows, q = padded_reqs * self.query_len, self.query_len
        cad = CommonAttentionMetadata(
            query_start_loc=self.query_start_loc[:padded_reqs + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[:padded_reqs + 1].clone(),
            seq_lens=self.seq_lens[:padded_reqs], num_reqs=padded_reqs, num_actual_tokens=rows,
            max_query_len=q,
            # Only sizes kernel launches: a recorded launch must suit every later length.
            max_seq_len=self.max_model_len,
            block_table_tensor=self.block_table[:padded_reqs],
            slot_mapping=self.slot_mapping[:rows], causal=True)
        return {"num_speculative_tokens": k, "target_token_ids": self.token_ids[:rows],
                "target_positions": self.positions[:rows],
                "target_hidden_states": self.hidden_states[:rows],
                "next_token_ids": self.next_token_ids[:padded_reqs],
                "token_indices_to_sample": self.token_indices_to_sample[:padded_reqs],
                "common_attn_metadata": cad,
                # Recorded steps draft greedily (drafter_graphs.py leaves sampled drafting
                # to vLLM), which reads no sampling metadata but this flag.
                "sampling_metadata": SimpleNamespace(all_greedy=True),
                "mm_embed_inputs": None, "num_rejected_tokens_gpu": self.num_rejected[:padded_reqs],
                "slot_mappings": None}
