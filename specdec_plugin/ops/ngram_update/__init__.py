"""One device n-gram step's bookkeeping: each request's next token, its count of valid sampled
tokens, and the sampled tokens appended to its device-resident history.

Why: with ``ngram_gpu`` (spec_decode/ngram_device.py) vLLM's ``update_token_ids_ngram`` and
our history append run after every target step, drafting or not: about 25 small torch ops,
each a launch on the host and a tiny kernel on the device. At batch 64 on an H200 (random
7B, every draft rejected, session 34's step log) n-gram's ``sample_tokens`` took 0.93 ms
against plain decoding's 0.48, and its steps ran 1.2% (median) to 2.3% (mean) slower, with no
drafter at all. One kernel does the same work.

What (vLLM 0.26's ``NgramProposerGPU.update_token_ids_ngram``, then the append, exactly): for
each row ``b < B``,
- ``valid_sampled[b] = sampled_token_ids[b]``, or all ``-1`` where ``discard_mask[b]``;
- ``valid_count[b]`` = how many entries of ``valid_sampled[b]`` are not ``-1`` and are below
  ``vocab_size`` (anywhere in the row, as vLLM counts them);
- ``next_token_ids[b] = valid_sampled[b, valid_count[b] - 1]`` where the count is positive,
  else the history's last token ``token_ids[b, num_tokens[b] - 1]`` (index clamped into the
  row);
- then, in place, ``token_ids[b, num_tokens[b] + j] = valid_sampled[b, j]`` for every ``j``
  below ``valid_count[b]`` whose entry is not ``-1`` and whose column lies inside the row.
``num_tokens`` is not changed (vLLM's runner advances it itself).

Shapes: ``sampled_token_ids`` ``[B, W]`` int32/int64; ``discard_mask`` ``[>= B]`` bool;
``token_ids`` ``[>= B, L]`` int32/int64, rows contiguous; ``num_tokens`` ``[>= B]``
int32/int64; all on one device. Returns ``(next_token_ids [B], valid_count [B] int32,
valid_sampled [B, W])``, ``next_token_ids`` in the promoted dtype of the sampled tokens and the
history, ``valid_sampled`` in the sampled tokens' dtype.

Providers: ``reference.py`` (torch: vLLM's function and the append, no host sync),
``triton.py`` (one program per request).
"""
