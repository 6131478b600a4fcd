"""Greedy drafting over a draft vocabulary, without widening its logits to the target's.

Why: an EAGLE-3 drafter may predict over a smaller vocabulary than its target (SmolLM2's
shipped one: 16320 of 49152 tokens), with ``draft_id_to_target_id`` (``d2t``) giving each draft
index ``k`` its target id ``k + d2t[k]``. vLLM's ``compute_logits`` for these drafters widens
every row to the full vocabulary (a -inf fill and a scatter) and the proposer then takes the
argmax of that: on the CPU about 5% of an EAGLE-3 step went there (BENCHMARKS.md). vLLM's
``use_local_argmax_reduction`` would avoid it, but Llama's EAGLE-3 class has no
``get_top_tokens`` (vLLM refuses the option for it).

What: the argmax over the draft-vocabulary logits, the same ones ``compute_logits`` starts from
(the model's own ``logits_processor(lm_head, hidden)``, which all-gathers the vocabulary shards
under tensor parallelism), mapped to its target id. No host sync and no data-dependent shape,
so our drafter graphs can record it; on the CPU it runs eagerly.

Same drafts: the widened row holds the draft logits at their target ids and -inf elsewhere, so
its maximum is the draft row's. On a tie the full-vocabulary argmax picks the lowest target
id, the local one the lowest draft index: the same token wherever draft index -> target id is
increasing. The map is checked once at load; where it is not increasing (not the case for the
drafters training/ builds: their draft vocabulary is sorted, ``stage_train.eagle3_vocab``)
vLLM's path stays. One case differs still: a row whose draft logits are all -inf (the widened
row's argmax is then target id 0, a filler, the local one draft index 0's target id); finite
weights and hidden states do not give one.
"""
from __future__ import annotations

import torch

from specdec_plugin.log import init_logger

logger = init_logger(__name__)

# vLLM 0.26's drafters whose ``compute_logits`` is exactly "logits_processor(lm_head, hidden),
# then widen through draft_id_to_target_id" (the same body in the three files; the test checks
# that against vLLM's source). Another model class keeps vLLM's path: its compute_logits may
# do more than widen.
WIDENING_COMPUTE_LOGITS = {
    ("vllm.model_executor.models.llama_eagle3", "Eagle3LlamaForCausalLM.compute_logits"),
    ("vllm.model_executor.models.qwen3_eagle3", "Eagle3Qwen3ForCausalLM.compute_logits"),
    ("vllm.model_executor.models.deepseek_eagle3", "Eagle3DeepseekV2ForCausalLM.compute_logits"),
}


def _widens_draft_vocab(model) -> bool:
    fn = getattr(type(model), "compute_logits", None)
    return (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)) \
        in WIDENING_COMPUTE_LOGITS


def local_argmax_applies(model) -> bool:
    """Whether ``greedy_draft_tokens(model, h)`` equals ``model.compute_logits(h).argmax(-1)``
    for every finite ``h``. Syncs with the device once (reads the map): call it at load time,
    never inside a graph recording."""
    if not _widens_draft_vocab(model):
        return False
    d2t = getattr(model, "draft_id_to_target_id", None)
    if not isinstance(d2t, torch.Tensor) or d2t.dim() != 1 or d2t.numel() == 0:
        return False
    targets = torch.arange(d2t.numel(), device=d2t.device) + d2t
    if not bool((targets[1:] > targets[:-1]).all()):
        logger.info("specdec_plugin: the drafter's draft -> target vocabulary map is not "
                    "increasing; greedy drafts widen to the full vocabulary as in vLLM")
        return False
    return True


def greedy_draft_tokens(model, hidden_states: torch.Tensor) -> torch.Tensor:
    """Target ids of the greedy drafts: argmax over the draft vocabulary, then ``k + d2t[k]``
    (int64, as ``argmax`` of the widened logits gives). Only where ``local_argmax_applies``."""
    logits = model.logits_processor(model.lm_head, hidden_states)
    top = logits.argmax(dim=-1)
    # d2t is read here, not cached at load, so a weight reload that changes it is followed.
    return top + model.draft_id_to_target_id[top]
