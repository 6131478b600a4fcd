"""Templated chat instructions at scale: topics x templates, no corpus needed.

The device has no network and no chat corpus, so chat prompts are built here: the topics and
templates of ``training/prompts.py`` (the first drafters' set) plus more of each, a few
thousand distinct instructions in all. Each instruction is its own name, so the held-out rule
(``prompt_sources.is_heldout``) decides on the text itself.
"""
from __future__ import annotations

from training.prompts import (CODE_TASKS, CODE_TEMPLATES, MISC_INSTRUCTIONS, TOPIC_TEMPLATES,
                              TOPICS)

MORE_TOPICS = [
    "the Renaissance", "the Industrial Revolution", "ancient Egypt", "the Cold War",
    "the Silk Road", "the Vikings", "the Great Depression", "the Apollo program",
    "the theory of evolution", "relativity", "electricity", "magnetism", "light", "sound waves",
    "thermodynamics", "chemical reactions", "the periodic table", "atoms", "cells",
    "the heart", "the digestive system", "bacteria", "viruses", "antibiotics", "genetics",
    "photosynthesis in algae", "coral reefs", "deserts", "glaciers", "hurricanes", "tornadoes",
    "weather forecasting", "the ozone layer", "biodiversity", "endangered species", "forests",
    "agriculture", "bread baking", "fermentation", "chocolate", "tea", "spices", "vegetarian diets",
    "exercise", "running", "yoga", "meditation", "stress", "friendship", "leadership",
    "teamwork", "negotiation", "saving money", "budgeting", "investing", "credit scores",
    "taxes", "small businesses", "marketing", "remote work", "job interviews", "writing a resume",
    "learning a language", "reading habits", "poetry", "novels", "theater", "painting",
    "photography", "film making", "classical music", "rock music", "video games", "board games",
    "football", "basketball", "tennis", "cycling", "swimming", "mountain climbing", "travel",
    "Japan", "Brazil", "Egypt", "Canada", "India", "Australia", "the Arctic", "Antarctica",
    "cities", "public transport", "bridges", "skyscrapers", "airplanes", "trains", "ships",
    "rockets", "satellites", "Mars", "Jupiter", "comets", "the Big Bang", "telescopes",
    "computers", "operating systems", "databases", "compilers", "the Python language",
    "JavaScript", "Rust", "Linux", "Git", "open source software", "cloud computing",
    "cybersecurity", "passwords", "encryption", "computer networks", "the web browser",
    "search engines", "social media", "smartphones", "robots", "self-driving cars",
    "3D printing", "solar panels", "wind turbines", "batteries", "nuclear power", "water supply",
    "recycling plastic", "urban gardening", "pets", "dogs", "cats", "birds", "insects",
    "dinosaurs", "whales", "sharks", "elephants", "octopuses", "mushrooms", "trees",
]

MORE_TEMPLATES = [
    "Tell me about {t}.",
    "Why is {t} important?",
    "What is the future of {t}?",
    "Write a short essay about {t}.",
    "Explain {t} step by step.",
    "Describe {t} in one paragraph.",
    "What should a beginner know about {t}?",
    "Give me three questions to discuss about {t}, with short answers.",
    "Compare {t} with something similar and explain the differences.",
    "Write a short dialogue between two friends talking about {t}.",
    "What are the key facts about {t}? Answer in a bulleted list.",
    "Write a tweet about {t}.",
    "Create a short quiz about {t} with answers.",
    "What is the history of {t} in a few sentences?",
    "Explain {t} using an analogy.",
]

MORE_CODE_TASKS = [
    "parses a date string in ISO format", "finds the longest common prefix of a list of strings",
    "checks whether parentheses in a string are balanced", "implements a stack class",
    "implements a queue using two stacks", "computes the power set of a list",
    "generates all permutations of a string", "counts the lines in a file",
    "downloads nothing but simulates a retry loop with exponential backoff",
    "converts a Roman numeral to an integer", "converts an integer to binary",
    "finds the second largest number in a list", "groups a list of words by their first letter",
    "computes the dot product of two vectors", "implements quicksort",
    "checks whether two strings are anagrams", "returns the prime factors of n",
    "computes the running total of a list", "capitalizes every word in a sentence",
    "parses command line arguments with argparse", "writes a dictionary to a JSON file",
    "finds the most common element in a list", "implements a simple LRU cache",
    "validates a password's strength", "computes the Levenshtein distance of two strings",
]

MORE_CODE_TEMPLATES = [
    "Write a Python function that {t}. Explain how it works.",
    "How would I write code that {t}? Use Python.",
    "Write a Python function that {t} and add a few test cases.",
    "Write a C function that {t}.",
]


def all_instructions() -> list[str]:
    """Every distinct instruction, in a fixed order (no duplicates)."""
    items = []
    for topics, templates in ((TOPICS, TOPIC_TEMPLATES), (TOPICS, MORE_TEMPLATES),
                              (MORE_TOPICS, TOPIC_TEMPLATES), (MORE_TOPICS, MORE_TEMPLATES)):
        items += [tpl.format(t=t) for t in topics for tpl in templates]
    for tasks in (CODE_TASKS, MORE_CODE_TASKS):
        for templates in (CODE_TEMPLATES, MORE_CODE_TEMPLATES):
            items += [tpl.format(t=t) for t in tasks for tpl in templates]
    items += MISC_INSTRUCTIONS
    return list(dict.fromkeys(items))
