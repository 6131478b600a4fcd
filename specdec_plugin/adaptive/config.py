"""Whether the adaptive controller runs for an engine, decided once from the engine config.

It runs for every method that drafts one request at a time (n-gram, suffix, draft model,
EAGLE, EAGLE-3, MTP) unless the user turned it off (``SPECDEC_ADAPTIVE=0``), gave vLLM's own
batch-size schedule (``num_speculative_tokens_per_batch_size``: theirs wins), chose their own
scheduler class, or runs data parallel (ranks must agree on each step's draft length, and
vLLM's own dynamic schedule is refused there for the same reason).
"""
from __future__ import annotations

from specdec_plugin import envs
from specdec_plugin.adaptive.observed_cost import check_estimator
from specdec_plugin.log import init_logger

logger = init_logger(__name__)

# "ngram_gpu": method "ngram" matched on the device (spec_decode/ngram_device.py); its proposer
# drafts the step's chosen length, as the host one does.
ADAPTIVE_METHODS = frozenset({"ngram", "ngram_gpu", "suffix", "draft_model", "eagle", "eagle3",
                              "mtp"})

_SCHEDULERS = {
    False: "specdec_plugin.adaptive.scheduler.AdaptiveScheduler",
    True: "specdec_plugin.adaptive.scheduler.AdaptiveAsyncScheduler",
}


def why_not_adaptive(vllm_config) -> str | None:
    spec = vllm_config.speculative_config
    if spec is None or not spec.num_speculative_tokens:
        return "no speculative decoding"
    if not envs.adaptive_drafting():
        return "SPECDEC_ADAPTIVE=0"
    if spec.method not in ADAPTIVE_METHODS:
        return f"method {spec.method!r} is not adaptive"
    if spec.num_speculative_tokens_per_batch_size is not None:
        return "num_speculative_tokens_per_batch_size is set"
    if spec.parallel_drafting:
        return "parallel drafting"
    if vllm_config.parallel_config.data_parallel_size > 1:
        return "data parallel ranks must agree on every draft length"
    scheduler_cls = vllm_config.scheduler_config.scheduler_cls
    if scheduler_cls is not None and scheduler_cls not in _SCHEDULERS.values():
        return f"a custom scheduler_cls ({scheduler_cls})"
    return None


def _check_method_list(variable: str, methods: frozenset[str] | None) -> None:
    unknown = sorted((methods or frozenset()) - ADAPTIVE_METHODS)
    if unknown:
        raise ValueError(
            f"{variable} names {unknown}, which are not adaptive methods: "
            f"use 0, 1, or a comma list of {sorted(ADAPTIVE_METHODS - {'ngram_gpu'})}")


def _check_observed_cost_methods() -> None:
    _check_method_list("SPECDEC_ADAPTIVE_OBSERVED_COST", envs.adaptive_observed_cost_methods())


def _check_table_length_methods() -> None:
    _check_method_list("SPECDEC_ADAPTIVE_TABLE_LENGTHS", envs.adaptive_table_length_methods())


def _check_draft_graph_methods() -> None:
    _check_method_list("SPECDEC_ADAPTIVE_DRAFT_GRAPH_COST", envs.adaptive_draft_graph_cost_methods())


def _check_observed_estimator() -> None:
    check_estimator(envs.adaptive_observed_estimator(), "SPECDEC_ADAPTIVE_OBSERVED_ESTIMATOR=")


def _users_name(method: str) -> str:
    """The name per-method switches and defaults know ``method`` by: ``ngram_gpu`` (n-gram
    matched on the device) goes by the user's name for it, ``ngram``."""
    return "ngram" if method == "ngram_gpu" else method


def _named(methods: frozenset[str] | None, method: str) -> bool:
    """Whether a per-method switch's value covers ``method``."""
    return methods is None or _users_name(method) in methods


def learns_step_costs(method: str) -> bool:
    """Whether the controller of ``method`` corrects its cost table by observed step times."""
    return _named(envs.adaptive_observed_cost_methods(), method)


def times_every_length(method: str) -> bool:
    """Whether the start-up cost table of ``method`` is timed at every draft length's token
    counts (adaptive/measure.py) instead of interpolated between n and n*(1+K)."""
    return _named(envs.adaptive_table_length_methods(), method)


def times_draft_graphs(method: str) -> bool:
    """Whether the start-up cost table of ``method`` times drafting as the padded drafter
    graphs a step replays, where the drafter has them (adaptive/measure.py)."""
    return _named(envs.adaptive_draft_graph_cost_methods(), method)


# The margin a longer drafting length needs over the best shorter one (policy.py,
# ``length_gain``), by method where the default is not min_gain's 3%. EAGLE-3 picks its best
# drafting length. Why: with the margin its drafts stayed at 3 tokens where 4 were about 2.6%
# faster (H200, session 42, prose at batch 1: 1.033x of K every step). Without it, on the H200
# (session 43, SmolLM2 padded to 7B, prose and code edits, batches 1-64, three runs) it was
# within 1.014x of the better of plain decoding and K every step in all 8 cells, where the
# margin read 1.025 and 1.045 on prose at batch 1 and 4. On 2-core CPUs (4 rounds each) no
# cell was slower on an AVX-512 host (session 42) and none differed consistently on an AVX2
# one (session 43). Other methods are not measured without it.
DEFAULT_LENGTH_GAIN = {"eagle3": 0.0}


def length_gain(method: str) -> float | None:
    """The margin between drafting lengths for ``method``: the user's
    ``SPECDEC_ADAPTIVE_LENGTH_GAIN`` where set, else the method's default (None: min_gain)."""
    value = envs.adaptive_length_gain()
    return DEFAULT_LENGTH_GAIN.get(_users_name(method)) if value is None else value


def controller_settings(method: str) -> dict:
    """``DraftLengthController``'s keyword settings for an engine of ``method``, from the
    environment, read where the scheduler builds the controller (``apply_adaptive`` read them
    once before, so that a bad value failed before any model was loaded)."""
    return dict(allowed=envs.adaptive_lengths(),
                learn_costs=learns_step_costs(method), resume_gain=envs.adaptive_resume_gain(),
                protect_quantile=envs.adaptive_protect(),
                cost_estimator=envs.adaptive_observed_estimator(),
                probe_budget=envs.adaptive_probe_budget(), switch_gain=envs.adaptive_switch_gain(),
                length_gain=length_gain(method),
                measure_probes=envs.adaptive_probe_cost() == "observed",
                untested_decay=envs.adaptive_untested_decay())


def adaptive_enabled(vllm_config) -> bool:
    """Decided once, in the process that built the config (``apply_adaptive``), and carried
    to the engine and worker processes by the config itself."""
    return vllm_config.scheduler_config.scheduler_cls in _SCHEDULERS.values()


def _check_lengths(lengths: tuple[int, ...] | None, max_k: int) -> None:
    if lengths is not None and lengths[-1] > max_k:
        raise ValueError(f"SPECDEC_ADAPTIVE_LENGTHS={','.join(map(str, lengths))}: draft length "
                         f"{lengths[-1]} is over num_speculative_tokens={max_k}; give lengths "
                         f"from 0 to {max_k}, or unset it to let the controller choose from "
                         "every length")


def apply_adaptive(vllm_config) -> None:
    """Install the adaptive scheduler (idempotent: workers rebuild the config)."""
    reason = why_not_adaptive(vllm_config)
    if reason is not None:
        if vllm_config.speculative_config is not None and reason != "no speculative decoding":
            logger.info("specdec_plugin: adaptive drafting off (%s)", reason)
        return
    # The controller's settings are read again in the engine process (controller_settings, by
    # the scheduler); read here, where the config is built, a bad value fails before any model
    # is loaded. The method lists and the estimator's name are checked by name.
    settings = controller_settings(vllm_config.speculative_config.method)
    _check_lengths(settings["allowed"], vllm_config.speculative_config.num_speculative_tokens)
    _check_observed_cost_methods()
    _check_table_length_methods()
    _check_draft_graph_methods()
    _check_observed_estimator()
    scheduler = vllm_config.scheduler_config
    scheduler.scheduler_cls = _SCHEDULERS[bool(scheduler.async_scheduling)]
