"""Chat questions written by the target itself (self-instruct), for chat training data that is
not all built from a few dozen templates.

Why: session 18 found chat to be every drafter's weakest category on the evaluation set
(EAGLE-3 1.97 against 3.47 on code) while the training stage's own held-out chat, templated
like its training chat, read 2.52. The evaluation's chat prompts are free-form questions; the
training's are ``chat_instructions.py``'s topic x template grid. The drafters learn the text
the target writes in answer, so what matters is how varied the questions are, not how good.

How: a raw-text prompt lists five questions people sent to an assistant (drawn from the seed
questions below, the templated instructions and, after the first round, questions already
written) and ends with the next number; SmolLM2 continues the list, sampling at T=0.8, and
the line it writes is the new question. Filters keep complete, plain, new requests and drop
any that repeat an evaluation question (``too_close``). The result ships as
``training/self_instruct_questions.json`` and joins the chat prompts
(``prompt_sources.chat_prompts``); the held-out rule applies to them as to every prompt.

    python -m training.self_instruct --count 12000 --out training/self_instruct_questions.json

Runs through vLLM on whatever platform is installed (our CPU platform here, in minutes).
"""
from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path

QUESTIONS_FILE = Path(__file__).with_name("self_instruct_questions.json")
SHOTS = 5
MIN_WORDS, MAX_WORDS = 3, 40
MAX_CHARS = 240
CLOSE_JACCARD = 0.6  # word-set overlap at which a question counts as an evaluation question
TEMPERATURE = 0.8  # at 1.0 about one line in ten was word salad (CPU smoke run, 494 kept)
# A request starts like one; lines that start otherwise were mostly statements or fragments.
START_WORDS = frozenset("""
    what how why when where which who whom whose is are was were do does did can could would
    should will may might shall explain describe write give list create tell suggest compare
    summarize summarise name define plan rewrite translate generate make help find show design
    recommend calculate solve convert imagine provide outline identify brainstorm draft compose
    discuss analyze analyse classify edit propose evaluate""".split())
# Not a content filter for users; this keeps a file of text a 135M model wrote at random, shipped
# in the repository, clear of the topics a small model is worst at and a reader least wants.
BLOCKED_WORDS = frozenset("""
    sex sexual porn nude naked gay lesbian allah jesus god religion religious muslim christian
    jew jewish hindu nazi hitler racist racism kill killing murder suicide rape terror terrorist
    bomb weapon weapons gun guns drug drugs cocaine heroin abortion slave slavery""".split())

# Written for this file: many kinds of request (facts, how-to, advice, comparison, creative,
# code, maths, planning, rewriting), none of them an evaluation question.
SEED_QUESTIONS = [
    "How long should I boil an egg to get a soft yolk?",
    "What is the difference between weather and climate?",
    "Can you suggest a name for a small bakery?",
    "Why do cats purr?",
    "How do vaccines train the immune system?",
    "Write a thank-you note to a neighbour who watered my plants.",
    "What are some good stretches after a long run?",
    "Explain the difference between RAM and storage.",
    "How can I stop procrastinating on big projects?",
    "Write a four-line poem about a rainy Monday.",
    "What does a product manager do?",
    "Is it better to rent or buy a house?",
    "How do I center a div in CSS?",
    "What is a closure in JavaScript?",
    "Write a Python script that renames every .txt file in a folder to lowercase.",
    "Why does ice float on water?",
    "Give me a packing list for a beach holiday.",
    "What is the capital of Australia, and why is it not Sydney?",
    "How does compound interest work? Use an example with numbers.",
    "Plan a three-day trip to Rome for someone who loves food.",
    "What is the best way to learn to play the guitar as an adult?",
    "Rewrite this sentence to sound more formal: we can't make it to the meeting.",
    "What are the symptoms of dehydration?",
    "Who invented the telephone?",
    "How do airplanes stay in the air?",
    "Tell me a joke about programmers.",
    "What is the difference between a virus and a bacterium?",
    "How do I make my resume stand out?",
    "Write a short speech for my sister's wedding.",
    "What is 15% of 240?",
    "Solve for x: 3x + 7 = 22.",
    "What is machine learning, in one sentence?",
    "How do I fix a merge conflict in Git?",
    "What does the error 'index out of range' mean in Python?",
    "Suggest five hobbies I can do at home.",
    "Why do leaves change color in autumn?",
    "What happened during the fall of the Berlin Wall?",
    "Write a product review for a pair of noise-cancelling headphones.",
    "How many hours of sleep does a teenager need?",
    "What are the pros and cons of working at a startup?",
    "Describe the taste of a mango to someone who has never had one.",
    "How do I write a for loop in C?",
    "What is an API, and why do developers use them?",
    "Write a regular expression that matches a US phone number.",
    "What are three ways to reduce food waste at home?",
    "Why is the Mona Lisa so famous?",
    "How do tides work?",
    "Create a weekly workout plan for a beginner.",
    "What is the plot of The Hobbit?",
    "Write a cover letter opening for a junior data analyst job.",
    "How do I politely say no to extra work?",
    "Explain the difference between TCP and UDP.",
    "What is a prime number? List the first ten.",
    "Write a function in Java that reverses an array.",
    "What are good questions to ask at the end of a job interview?",
    "How do bees make honey?",
    "Why do we dream?",
    "Give me a simple recipe for vegetable soup.",
    "What is the meaning of the idiom 'break the ice'?",
    "How can I improve my handwriting?",
    "Write a text message inviting friends to a board game night.",
    "What is the tallest mountain in Africa?",
    "How does a refrigerator keep food cold?",
    "What are the main parts of a cell?",
    "Convert 5 miles to kilometers.",
    "What is the difference between 'affect' and 'effect'?",
    "Write a short bedtime story about a brave turtle.",
    "How does GPS know where I am?",
    "What should I consider when adopting a dog?",
    "Explain what a database index is and when to add one.",
    "Write a SQL query that finds the three most expensive products.",
    "What were the causes of World War I?",
    "How do I calm down before a presentation?",
    "Summarize the main idea of supply and demand.",
    "What is the boiling point of water at high altitude, and why is it different?",
    "Write a limerick about a forgetful wizard.",
    "How do solar eclipses happen?",
    "What is the difference between a crocodile and an alligator?",
    "Suggest a healthy breakfast that takes five minutes.",
    "How do I unit test a function that reads the current time?",
]


def normalize(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def word_set(text: str) -> set[str]:
    """The normalized words of ``text``: what ``too_close`` compares."""
    return set(normalize(text).split())


def too_close(question: str, references: list[set[str]]) -> bool:
    """Whether ``question`` repeats one of ``references`` (word sets): Jaccard overlap at least
    ``CLOSE_JACCARD``. Used to keep the evaluation's chat questions out of training."""
    words = word_set(question)
    return any(len(words & ref) >= CLOSE_JACCARD * len(words | ref) for ref in references)


def ask_prompt(shots: list[str]) -> str:
    """A numbered list of ``shots`` that ends where the next question starts."""
    lines = [f"{i}. {q}" for i, q in enumerate(shots, 1)]
    return ("Here is a list of questions and requests that people sent to an AI assistant.\n\n"
            + "\n".join(lines) + f"\n{len(shots) + 1}.")


def parse_question(completion: str, finished_line: bool) -> str | None:
    """The question in a completion of ``ask_prompt``, or None if it is not a usable one:
    unfinished (cut by the token limit), too short or long, not plain text, not ending like a
    sentence, not starting like a request (``START_WORDS``), or on a ``BLOCKED_WORDS`` topic."""
    if not finished_line:
        return None
    text = completion.strip()
    words = text.split()
    if not MIN_WORDS <= len(words) <= MAX_WORDS or len(text) > MAX_CHARS:
        return None
    if not text.isascii() or not text[0].isalpha() or text[-1] not in "?.!":
        return None
    if "http" in text or "assistant" in text.lower() or "question" in text.lower()[:20]:
        return None  # links and talk about the list itself, not a request
    words = normalize(text).split()
    if words[0] not in START_WORDS or BLOCKED_WORDS.intersection(words):
        return None
    return text


def draw_shots(rng: random.Random, seeds: list[str], written: list[str]) -> list[str]:
    """Five shots: at least two seeds, the rest from questions already written when there are
    enough (self-instruct's bootstrapping), so later rounds drift away from the seeds."""
    from_written = min(len(written), SHOTS - 2) if len(written) >= 50 else 0
    shots = rng.sample(seeds, SHOTS - from_written) + rng.sample(written, from_written)
    rng.shuffle(shots)
    return shots


class QuestionPool:
    """The questions kept so far: new by normalized text, and not an evaluation question."""

    def __init__(self, excluded: list[str], references: list[str]):
        self.seen = {normalize(q) for q in excluded}
        self.references = [word_set(q) for q in references]
        self.questions: list[str] = []
        self.rejected = {"unusable": 0, "duplicate": 0, "evaluation": 0}

    def offer(self, completion: str, finished_line: bool) -> bool:
        question = parse_question(completion, finished_line)
        if question is None:
            self.rejected["unusable"] += 1
            return False
        key = normalize(question)
        if key in self.seen:
            self.rejected["duplicate"] += 1
            return False
        self.seen.add(key)
        if too_close(question, self.references):
            self.rejected["evaluation"] += 1
            return False
        self.questions.append(question)
        return True


def evaluation_questions() -> list[str]:
    """The chat questions the held-out evaluation (and the GPU tests) ask."""
    from training.eval_prompts import chat_questions

    return chat_questions()


def load_questions(path: Path = QUESTIONS_FILE) -> list[str]:
    if not path.exists():
        return []
    return json.loads(path.read_text())["questions"]


def generate(llm, count: int, rounds_prompts: int, seed: int, deadline_s: float,
             samples: int = 4, log=print) -> tuple[list[str], dict]:
    from vllm import SamplingParams

    from training.chat_instructions import all_instructions

    rng = random.Random(seed)
    seeds = SEED_QUESTIONS + rng.sample(all_instructions(), 4 * len(SEED_QUESTIONS))
    pool = QuestionPool(excluded=seeds, references=evaluation_questions())
    # Several samples per prompt share its prefill, the larger part of the work on a CPU.
    params = SamplingParams(n=samples, temperature=TEMPERATURE, top_p=0.95, max_tokens=64,
                            stop=["\n"])
    t0, tokens, rounds = time.time(), 0, 0
    while len(pool.questions) < count and time.time() - t0 < deadline_s:
        prompts = [ask_prompt(draw_shots(rng, seeds, pool.questions))
                   for _ in range(rounds_prompts)]
        for out in llm.generate(prompts, params, use_tqdm=False):
            for completion in out.outputs:
                tokens += len(completion.token_ids)
                pool.offer(completion.text, completion.finish_reason == "stop")
        rounds += 1
        log(f"self-instruct round {rounds}: {len(pool.questions)} questions kept, "
            f"rejected {pool.rejected}, {tokens / (time.time() - t0):.0f} tokens/s")
    meta = {"kept": len(pool.questions), "rejected": pool.rejected, "rounds": rounds,
            "prompts_per_round": rounds_prompts, "samples_per_prompt": samples,
            "generated_tokens": tokens,
            "seconds": round(time.time() - t0, 1), "seed": seed,
            "sampling": f"T={TEMPERATURE}, top_p=0.95, one line, {SHOTS} shots (ask_prompt)"}
    return pool.questions[:count], meta


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=12000)
    p.add_argument("--out", type=Path, default=QUESTIONS_FILE)
    p.add_argument("--model", type=Path, help="target checkpoint (default: fetch_smollm2())")
    p.add_argument("--prompts-per-round", type=int, default=256)
    p.add_argument("--samples", type=int, default=4, help="completions per prompt")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--deadline-s", type=float, default=3600.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    from vllm import LLM

    from specdec_plugin.models.smollm2 import fetch_smollm2

    model = args.model or fetch_smollm2()
    llm = LLM(model=str(model), max_model_len=1024, max_num_seqs=args.max_num_seqs,
              seed=args.seed)
    questions, meta = generate(llm, args.count, args.prompts_per_round, args.seed,
                               args.deadline_s, args.samples)
    meta["model"] = Path(model).name
    args.out.write_text(json.dumps({"meta": meta, "questions": questions}, indent=0) + "\n")
    print(f"wrote {len(questions)} questions to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
