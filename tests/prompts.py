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

# Prompts for speculative decoding: the first 8 above plus texts that repeat themselves, where
# n-gram and suffix drafters find matches (code edits, lists, quoted passages).
SPEC_PROMPTS = PROMPTS + [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Repeat the sentence exactly: the red fox runs. the red fox runs. the red fox runs.",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\nfor k in range(10):\n",
    "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
    "Monday, Tuesday, Wednesday, Thursday,",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "The following is a haiku about the sea:\n",
    "1, 2, 3, 4, 5, 6, 7, 8,",
]
