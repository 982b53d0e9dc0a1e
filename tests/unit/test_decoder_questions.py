"""The int8 gate's task-level check: factual questions with keyword answers."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from tritonforge.export.errors import SpecError
from tritonforge.export.specs.smollm2 import smollm2_spec
from tritonforge.tasks.generation.export.questions import (
    Question,
    prompt_ids,
    read_questions,
    task_problem,
)


def test_an_answer_is_right_when_any_keyword_appears_in_any_case() -> None:
    q = Question("How many days are there in a week?", ("seven", "7"))
    assert q.answered_by("There are Seven days.")
    assert q.answered_by("7")
    assert not q.answered_by("There are six days.")


def test_questions_parse_and_every_malformed_line_is_named(tmp_path: Path) -> None:
    good = tmp_path / "q.tsv"
    good.write_text("# comment\nWhat is 2 plus 2?\t4| four \n\nCapital of Japan?\tTokyo\n")
    assert read_questions(good) == [
        Question("What is 2 plus 2?", ("4", "four")),
        Question("Capital of Japan?", ("Tokyo",)),
    ]
    bad = tmp_path / "bad.tsv"
    bad.write_text("No tab here\nEmpty keywords?\t | \nFine?\tyes\n")
    with pytest.raises(SpecError) as e:
        read_questions(bad)
    assert "No tab here" in str(e.value) and "Empty keywords" in str(e.value)
    assert "2 in all" in str(e.value)


def test_the_gate_allows_at_most_the_declared_answers_lost() -> None:
    fp32 = [True] * 10 + [False] * 10
    assert task_problem(fp32, [True] * 8 + [False] * 12, 2) is None
    problem = task_problem(fp32, [True] * 7 + [False] * 13, 2)
    assert problem is not None and "7 of 20" in problem and "fp32 on 10" in problem
    assert task_problem(fp32, [True] * 12 + [False] * 8, 0) is None  # more right is fine


def test_the_shipped_questions_parse_and_are_part_of_the_fingerprint() -> None:
    spec = smollm2_spec()
    asked = read_questions(spec.questions_file)
    assert len(asked) >= 30
    assert len({q.text for q in asked}) == len(asked)
    assert spec.questions_file in spec.source_files
    assert spec.int8_gate.max_task_answers_lost == 2  # issue #35: fp32's count minus 2


def test_prompts_go_through_the_chat_template_with_bos_once() -> None:
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "<s>": 1, "user:": 2, "hi": 3}, "[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    meta = {"chat_template": "{% for m in messages %}user: {{ m.content }}{% endfor %}"}
    assert prompt_ids(tok, ["hi"], {**meta, "prompt_bos_token_id": 1}) == [[1, 2, 3]]
    assert prompt_ids(tok, ["hi"], {**meta, "prompt_bos_token_id": None}) == [[2, 3]]
