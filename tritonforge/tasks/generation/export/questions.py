"""The int8 gate's task-level check: short factual questions with keyword answers, answered
greedily by fp32 and int8 through the serving scheduler; int8 must be right on at least as many
as fp32 minus :attr:`Int8Gate.max_task_answers_lost` (issue #35's rule for the default)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonforge.export.errors import SpecError
from tritonforge.export.specs.text_inputs import read_sentences
from tritonforge.generation import render_prompt, with_bos
from tritonforge.tasks.generation.export import verify


@dataclass(frozen=True)
class Question:
    """A question and the keywords one of which a right answer contains (case-insensitive)."""

    text: str
    keywords: tuple[str, ...]

    def answered_by(self, answer: str) -> bool:
        low = answer.lower()
        return any(k.lower() in low for k in self.keywords)


def read_questions(path: Path) -> list[Question]:
    """``question<TAB>kw1|kw2`` per line (``#`` comments and blank lines skipped);
    :class:`SpecError` naming every malformed line."""
    out, bad = [], []
    for n, line in enumerate(read_sentences(path), 1):
        text, _, keys = line.partition("\t")
        keywords = tuple(k.strip() for k in keys.split("|") if k.strip())
        if not text.strip() or not keywords:
            bad.append(f"{n}: {line[:60]!r}")
            continue
        out.append(Question(text.strip(), keywords))
    if bad:
        raise SpecError(
            f"{path}: lines need 'question<TAB>keyword|keyword': {'; '.join(bad[:5])} "
            f"({len(bad)} in all)"
        )
    return out


def prompt_ids(tokenizer: Any, texts: Sequence[str], meta: dict[str, Any]) -> list[list[int]]:
    """The served prompt tokens of ``texts``: each as one user message through the chat template
    (``meta``: generation.json's), the checkpoint's bos first where its tokenizer adds one."""
    template, bos = meta["chat_template"], meta["prompt_bos_token_id"]
    return [
        with_bos(
            tokenizer.encode(render_prompt(t, template, True), add_special_tokens=False).ids, bos
        )
        for t in texts
    ]


def right_answers(
    step: Any,
    empty_past: Any,
    questions: Sequence[Question],
    prompts: Sequence[list[int]],
    run: dict[str, Any],
) -> list[bool]:
    """Whether each greedy answer (``run``'s token count, 8 rows at a time as served) is right."""
    if not questions:
        return []
    tokens = verify.scheduler_tokens(step, empty_past, max_running=8, **{**run, "prompts": prompts})
    tok = run["tokenizer"]
    return [q.answered_by(tok.decode(t)) for q, t in zip(questions, tokens, strict=True)]


def task_problem(fp32: Sequence[bool], int8: Sequence[bool], max_lost: int) -> str | None:
    """The gate's message when int8 is right on fewer than fp32's count minus ``max_lost``."""
    if sum(int8) >= sum(fp32) - max_lost:
        return None
    return (
        f"int8 gate: right on {sum(int8)} of {len(int8)} factual questions, fp32 on {sum(fp32)} "
        f"(at most {max_lost} fewer allowed)"
    )
