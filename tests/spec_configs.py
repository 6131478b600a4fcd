"""The speculative configurations the tests run, by method name, as users write them, and the
target model each one runs on."""
from __future__ import annotations

K = 3

# Methods with a trained drafter shipped in specdec_plugin/assets/drafters.
TRAINED = ("draft_model", "eagle", "eagle3", "mtp")


def spec_config(method: str, target_path: str) -> dict:
    if method in TRAINED:
        from specdec_plugin.models.drafters import speculative_config

        # The MTP checkpoint has one MTP layer: it drafts one token per step.
        return speculative_config(method, 1 if method == "mtp" else K)
    builders = {
        "ngram": lambda: {"method": "ngram", "num_speculative_tokens": K,
                          "prompt_lookup_min": 1, "prompt_lookup_max": 3},
        "suffix": lambda: {"method": "suffix", "num_speculative_tokens": K},
        # The target as its own draft model: every draft token must be accepted.
        "draft_model_self": lambda: {"method": "draft_model", "model": target_path,
                                     "num_speculative_tokens": K},
    }
    return builders[method]()


def target_for(method: str, smollm2_path: str) -> str:
    """SmolLM2 for every method but MTP, whose target is SmolLM2 with MTP layers (MiMo format)."""
    if method == "mtp":
        from specdec_plugin.models.drafters import target_for as drafter_target

        return str(drafter_target("mtp"))
    return smollm2_path
