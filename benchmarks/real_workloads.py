"""Two real-traffic workloads for issue 11's real-acceptance bar (SmolLM2 chat prompts).

- ``prose``: requests for new text (essays, stories, explanations). The answer shares little
  with the prompt, so n-gram and suffix drafts rarely match: speculation must cost nothing.
- ``code_edit``: a code snippet and a small change to make. The answer copies most of the
  snippet, so n-gram and suffix drafts often match: speculation should pay.

16 prompts each, so batches up to 16 have no duplicate; larger batches repeat them
round-robin. Written for this benchmark (no dataset to download on the GPU machine).
"""
from __future__ import annotations

from tests.prompts_gpu import chat

PROSE_REQUESTS = [
    "Write a short essay about why people enjoy walking in the mountains.",
    "Tell a story about a lighthouse keeper who finds a message in a bottle.",
    "Describe a busy morning market in a small coastal town.",
    "Explain why sleep matters for memory, for a general audience.",
    "Write a letter to a friend describing your first week in a new city.",
    "Describe the changing of the seasons in a forest, in a few paragraphs.",
    "Write a product review of an imaginary bicycle that can fold into a backpack.",
    "Tell a story about two rival bakers who must work together for a festival.",
    "Explain how early sailors navigated by the stars.",
    "Write a speech a teacher might give on the last day of school.",
    "Describe what a city might look like one hundred years from now.",
    "Write a diary entry of a cat watching birds from a window.",
    "Explain the history of the printing press and why it changed the world.",
    "Tell a story about a child who builds a robot out of old radios.",
    "Write a travel guide paragraph about a quiet island with no cars.",
    "Describe a thunderstorm from the point of view of a farmer.",
]

_SNIPPETS = [
    ("def total(items):\n    s = 0\n    for x in items:\n        s = s + x\n    return s\n",
     "Rename the variable s to running_sum"),
    ("def greet(name):\n    print('Hello, ' + name)\n    print('Welcome back, ' + name)\n",
     "Use f-strings instead of string concatenation"),
    ("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"
     "        self.items.append(x)\n\n    def pop(self):\n        return self.items.pop()\n",
     "Add a method peek that returns the top item without removing it"),
    ("def is_even(n):\n    if n % 2 == 0:\n        return True\n    else:\n        return False\n",
     "Add a docstring to the function"),
    ("for i in range(10):\n    if i % 3 == 0:\n        print(i, 'fizz')\n    else:\n        print(i)\n",
     "Change the loop to run up to 20"),
    ("def read_lines(path):\n    f = open(path)\n    lines = f.readlines()\n    f.close()\n"
     "    return lines\n", "Use a with statement to open the file"),
    ("def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n",
     "Add type hints to both functions"),
    ("numbers = [3, 1, 4, 1, 5, 9, 2, 6]\nsquares = []\nfor n in numbers:\n"
     "    squares.append(n * n)\nprint(squares)\n", "Rename numbers to values everywhere"),
    ("def find_max(xs):\n    best = xs[0]\n    for x in xs:\n        if x > best:\n"
     "            best = x\n    return best\n", "Rename best to largest"),
    ("SELECT name, age\nFROM users\nWHERE age > 30\nORDER BY name;\n",
     "Also select the email column"),
    ("def count_words(text):\n    words = text.split()\n    counts = {}\n    for w in words:\n"
     "        counts[w] = counts.get(w, 0) + 1\n    return counts\n",
     "Make the function lowercase the text first"),
    ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
     "    def norm(self):\n        return (self.x ** 2 + self.y ** 2) ** 0.5\n",
     "Add a method that returns the point as a tuple"),
    ("def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
     "Add a check that raises ValueError when n is negative"),
    ("import os\n\ndef list_python_files(folder):\n    out = []\n    for name in os.listdir(folder):\n"
     "        if name.endswith('.py'):\n            out.append(name)\n    return out\n",
     "Return the files sorted by name"),
    ("def average(xs):\n    return sum(xs) / len(xs)\n\nprint(average([1, 2, 3]))\n",
     "Return 0 for an empty list"),
    ("def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n"
     "    return x\n", "Rename x to value"),
]


def _edit(code: str, change: str) -> str:
    return chat(f"{change} in this code, and reply with the whole updated code.\n\n```\n{code}```")


WORKLOADS: dict[str, list[str]] = {
    "prose": [chat(p) for p in PROSE_REQUESTS],
    "code_edit": [_edit(code, change) for code, change in _SNIPPETS],
}
assert all(len(prompts) == 16 for prompts in WORKLOADS.values())
