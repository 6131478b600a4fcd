"""The speculative configurations the tests run, by method name, as users write them."""
from __future__ import annotations

K = 3


def spec_config(method: str, target_path: str) -> dict:
    builders = {
        "ngram": lambda: {"method": "ngram", "num_speculative_tokens": K,
                          "prompt_lookup_min": 1, "prompt_lookup_max": 3},
        "suffix": lambda: {"method": "suffix", "num_speculative_tokens": K},
        # The target as its own draft model: every draft token must be accepted.
        "draft_model_self": lambda: {"method": "draft_model", "model": target_path,
                                     "num_speculative_tokens": K},
    }
    return builders[method]()
