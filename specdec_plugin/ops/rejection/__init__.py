"""Rejection sampling for speculative decoding (Leviathan et al. 2022), as four kernels.

Same semantics as vLLM 0.26's Triton kernels in ``vllm/v1/sample/rejection_sampler.py``; the
host-side glue (uniform draws, exponential noise, which kernel runs when) lives in
``specdec_plugin.spec_decode.rejection_sampler``.

Layout shared by every provider:
- ``cu_num_draft_tokens`` ``[batch]`` int32, INCLUSIVE cumulative draft counts (request i owns
  draft tokens ``[cu[i-1], cu[i])``, ``cu[-1]`` = 0);
- ``draft_token_ids`` ``[num_tokens]`` int32; ``-1`` marks a padded draft that is always rejected;
- ``draft_probs`` ``[num_tokens, vocab]`` float32 or ``None`` (no draft distribution: ngram and
  greedy drafters; the draft is treated as one-hot on the drafted token);
- ``target_probs`` ``[num_tokens, vocab]`` float32 (softmax after temperature/top-k/top-p);
- ``bonus_token_ids`` ``[batch, 1]`` int32, ``is_greedy`` ``[batch]`` bool or ``None``;
- ``output_token_ids`` ``[batch, max_spec_len + 1]`` int32, filled with ``-1``
  (``PLACEHOLDER_TOKEN_ID``) by the caller. Row i receives its accepted drafts, then either the
  recovered / target-argmax token at the first rejection or, when every draft is accepted, the
  bonus token at column ``num_draft_tokens[i]``. Nothing else in the row is written.

Ops:
- ``rejection_greedy_sample``: greedy rows (all rows when ``is_greedy`` is None): emit the target
  argmax until the first draft that differs from it. In synthetic mode a draft is accepted with a
  fixed per-position rate instead.
- ``rejection_random_sample``: non-greedy rows: accept draft x with probability
  ``min(1, p(x) / q(x))`` (``uniform < p/q``), else emit the recovered token.
- ``sample_recovered_tokens``: per draft position, a sample of ``norm(max(0, p - q))`` (or of p
  with the drafted token removed when there are no draft probs) by the exponential race
  ``argmax(weight / E)`` with one exponential vector ``E`` per request (``inv_q = 1 / E``).
- ``expand_batch_to_tokens``: broadcast a per-request value to that request's draft tokens,
  replacing ``replace_from`` by ``replace_to`` (greedy temperature 0 -> 1).
"""
