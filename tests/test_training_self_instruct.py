"""Self-instruct chat questions (training/self_instruct.py): what the filters keep, that no
evaluation question gets into training, and that the shipped questions reach the chat prompts."""
from __future__ import annotations

import random

import pytest

from training.self_instruct import (SEED_QUESTIONS, SHOTS, QuestionPool, ask_prompt, draw_shots,
                                    evaluation_questions, load_questions, normalize,
                                    parse_question, too_close, word_set)


def test_the_prompt_ends_where_the_next_question_starts():
    prompt = ask_prompt(["Why do cats purr?", "What is 15% of 240?"])
    assert prompt.endswith("\n1. Why do cats purr?\n2. What is 15% of 240?\n3.")


@pytest.mark.parametrize("completion, finished, want", [
    (" How do I keep basil alive indoors?", True, "How do I keep basil alive indoors?"),
    (" Write a poem about the sea.", True, "Write a poem about the sea."),
    (" How do I keep basil alive indoors", False, None),      # cut by the token limit
    (" Why?", True, None),                                    # too short
    (" " + "word " * 50 + "end.", True, None),                # too long
    (" See https://example.com for more.", True, None),       # a link
    (" 7. What is a monad?", True, None),                     # numbering, not a question
    (" Qu'est-ce que c'est l'été ?", True, None),             # not plain ASCII
    (" Tell me more about the ocean and", True, None),        # not a finished sentence
    (" Questions about science are welcome.", True, None),    # talk about the list itself
    (" A kite is a toy that flies.", True, None),             # a statement, not a request
    (" Why do some people hate guns?", True, None),           # a blocked topic
])
def test_parse_question(completion, finished, want):
    assert parse_question(completion, finished) == want


def test_too_close_catches_a_rewording_but_not_a_new_question():
    refs = [word_set("Why is the sky blue?")]
    assert too_close("Why is the sky blue at noon?", refs)
    assert not too_close("Why is the ocean salty?", refs)


def test_the_pool_drops_repeats_seeds_and_evaluation_questions():
    evaluation = evaluation_questions()
    pool = QuestionPool(excluded=["Why do cats purr?"], references=evaluation)
    assert pool.offer(" How do I keep basil alive indoors?", True)
    assert not pool.offer(" how do I keep basil alive indoors?", True)  # same, other case
    assert not pool.offer(" Why do cats purr?", True)                   # a seed
    assert not pool.offer(" " + evaluation[0], True)                    # an evaluation question
    assert not pool.offer(" Why?", True)
    assert pool.questions == ["How do I keep basil alive indoors?"]
    assert pool.rejected == {"unusable": 1, "duplicate": 2, "evaluation": 1}


def test_no_seed_repeats_an_evaluation_question():
    refs = [word_set(q) for q in evaluation_questions()]
    assert len(refs) >= 20
    close = [q for q in SEED_QUESTIONS if too_close(q, refs)]
    assert not close, close


def test_shots_mix_seeds_with_written_questions_once_there_are_enough():
    rng = random.Random(random.randrange(1 << 30))
    seeds = [f"seed {i}?" for i in range(40)]
    assert all(s in seeds for s in draw_shots(rng, seeds, [f"new {i}?" for i in range(10)]))
    written = [f"new {i}?" for i in range(60)]
    shots = draw_shots(rng, seeds, written)
    assert len(shots) == len(set(shots)) == SHOTS
    assert sum(s in written for s in shots) == SHOTS - 2


def test_shipped_questions_are_new_plain_and_in_the_chat_prompts():
    from training.prompt_sources import chat_prompts

    questions = load_questions()
    if not questions:
        pytest.skip("no self_instruct_questions.json shipped")
    assert len({normalize(q) for q in questions}) == len(questions)
    assert all(parse_question(q, True) == q for q in questions)
    refs = [word_set(q) for q in evaluation_questions()]
    assert not [q for q in questions if too_close(q, refs)]
    names = {p["name"] for p in chat_prompts()}
    assert all(f"chat/{q}" in names for q in questions)
