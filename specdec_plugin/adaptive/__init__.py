"""Adaptive draft length: each engine step, choose how many tokens to draft (0 to K).

The pieces, in the order data flows through them:

- ``cost_model.py``: how long an engine step takes at each batch size and draft length,
  interpolated from forward passes timed on the device at engine start (``measure.py``).
- ``step_timing.py``: what each pure decode step really took, from the times the scheduler
  handled it, charged to the draft length it verified.
- ``observed_cost.py``: the cost table times a per-length factor learned from those step times,
  for when the start-up timings miss what serving steps cost.
- ``acceptance.py``: per-position acceptance rates observed so far, per request and for the
  whole engine, decayed every step so that old evidence fades.
- ``policy.py``: the decision itself, a pure function (acceptance and costs in, draft length
  out) that maximises expected tokens per second.
- ``controller.py``: holds the state, calls the policy once per step, logs regime changes.
- ``scheduler.py``: vLLM's scheduler with the controller in the seat of vLLM's own
  batch-size schedule (``num_speculative_tokens_per_batch_size``).
- ``graphs.py``: full device graphs for every draft length the controller may choose.
- ``metrics.py``: the chosen lengths as a Prometheus counter next to vLLM's ``spec_decode_*``.
"""
