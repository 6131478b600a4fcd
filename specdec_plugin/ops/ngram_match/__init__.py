"""N-gram prompt lookup on the device: for each request, the drafts our C++ index proposes.

The rule (``specdec_plugin/spec_decode/ngram_index.py``, the same as vLLM 0.26's
``NgramProposer``): with ``n`` the request's token count, find the longest ``l`` in
``[min_n, max_n]`` whose last ``l`` tokens also occur earlier, starting at some
``s <= n - 1 - l`` (so at least one token follows the occurrence); among those occurrences the
earliest ``s`` wins. The draft is the tokens after it, at most ``min(k, max_model_len - n)``
and never past the history's end. No such ``l``, or ``n < min_n``: no draft.

Layout shared by every provider:
- ``token_ids`` ``[batch, max_len]`` int32/int64, row ``b`` = request ``b``'s history (only the
  first ``num_tokens[b]`` entries are read; the rest may hold anything, e.g. rejected drafts);
- ``num_tokens`` ``[batch]`` int32/int64 in ``[0, max_len]``;
- ``active`` ``[batch]`` bool or ``None``: rows that may draft (``None``: all);
- returns ``(drafts, num_drafts)``: ``drafts`` ``[batch, k]`` int32 with the draft in the first
  ``num_drafts[b]`` columns and ``-1`` after it, ``num_drafts`` ``[batch]`` int32.

Providers: ``reference.py`` (torch, no host sync, batched over requests), ``triton.py`` (one
program per request); on the CPU the host path keeps the C++ index (``spec_decode/ngram.py``).
"""
