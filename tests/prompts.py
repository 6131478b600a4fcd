"""Prompts of different lengths shared by the correctness tests."""

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "List three primary colors:",
    "Question: What is the boiling point of water at sea level in Celsius?\nAnswer:",
    "import numpy as np\n\ndef normalize(v):\n    \"\"\"Return v scaled to unit length.\"\"\"\n",
    "The quick brown fox",
    (
        "Speculative decoding speeds up inference of large language models by letting a small "
        "draft model propose several tokens which the large target model then verifies in a "
        "single forward pass. The key property of the method is that"
    ),
]

# Long enough to need several chunks when the token budget per step is small.
LONG_PROMPT = " ".join(
    f"Item {i}: the {w} jumps over the lazy dog near river number {i * 7}."
    for i, w in enumerate(["fox", "cat", "horse", "rabbit", "wolf", "deer", "bear", "owl"] * 3)
)
