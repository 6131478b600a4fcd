"""32 prompts for the GPU correctness tests and the SmolLM2 benchmark: the CPU tests' prompts
(plain text, code, self-repeating text) plus chat-formatted questions in SmolLM2's template,
the kind of traffic the drafters were trained on (text the target generated itself)."""
from __future__ import annotations

from tests.prompts import SPEC_PROMPTS

_QUESTIONS = [
    "What is the difference between a list and a tuple in Python?",
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain photosynthesis in two sentences.",
    "Give me three tips for writing clear emails.",
    "How do I reverse a linked list? Show code.",
    "What causes the seasons on Earth?",
    "Write a haiku about the ocean.",
    "Summarize the plot of Romeo and Juliet.",
    "What is a binary search and when should I use it?",
    "Write a SQL query that counts orders per customer.",
    "Why is the sky blue?",
    "List the planets of the solar system in order.",
    "How does a hash table work?",
    "Write a short story opening about a robot who learns to paint.",
    "What are the main causes of inflation?",
    "Explain recursion to a ten-year-old.",
    "Write a bash command that finds all .py files larger than 1 MB.",
    "What is the Pythagorean theorem? Give an example.",
    "Describe how a bicycle gear system works.",
    "Write a Python class for a simple bank account with deposit and withdraw methods.",
]


def chat(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


BENCH_PROMPTS = (list(SPEC_PROMPTS) + [chat(q) for q in _QUESTIONS])[:32]
assert len(BENCH_PROMPTS) == 32, len(BENCH_PROMPTS)
