"""A deterministic text corpus with a realistic length mix, generated from a fixed seed.

Embedding traffic mixes short search queries, single sentences and paragraph-sized passages; the
mix matters because a served batch pads every text to its longest member. The default mix
(by words): 30% queries of 3-10 words, 50% sentences of 12-40 words, 20% passages of 50-150
words (about 70-200 WordPiece tokens, below MiniLM's 256-token limit). Same seed, same corpus, on
every machine and Python version (``random.Random`` with integer draws only).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_SEED = 20240601
DEFAULT_SIZE = 1000

_SUBJECTS = (
    "the model server",
    "our search team",
    "a new customer",
    "the support engineer",
    "the billing service",
    "this quarterly report",
    "the mobile app",
    "a small bakery",
    "the city council",
    "the research group",
    "my neighbour",
    "the delivery driver",
    "the training pipeline",
    "an old laptop",
    "the hiking trail",
    "the football club",
    "the hospital",
    "the weather forecast",
    "the recipe",
    "the museum",
)
_VERBS = (
    "explains",
    "improves",
    "reduces",
    "describes",
    "compares",
    "announces",
    "requires",
    "delays",
    "supports",
    "measures",
    "recommends",
    "rejects",
    "updates",
    "shows",
    "predicts",
    "protects",
    "replaces",
    "summarises",
    "schedules",
    "tracks",
)
_OBJECTS = (
    "the latency of every request",
    "a cheaper way to store photos",
    "the opening hours",
    "how to reset a forgotten password",
    "the cost of shipping abroad",
    "fresh bread every morning",
    "the results of the last experiment",
    "a faster route to the station",
    "the risk of heavy rain this weekend",
    "the size of the embedding vectors",
    "new rules for parking downtown",
    "a refund for the cancelled order",
    "the number of active users",
    "a vegetarian pasta dish",
    "the history of the old bridge",
    "the battery life of the phone",
    "better answers to common questions",
    "the schedule for the summer league",
    "the accuracy of the quantized model",
    "a safer password policy",
)
_TAILS = (
    "before the end of the month",
    "according to the latest survey",
    "without any downtime",
    "for most of our users",
    "after a long discussion",
    "in the northern region",
    "with a short delay",
    "because the old system was too slow",
    "on weekdays only",
    "as expected",
    "despite the holiday season",
    "in under two seconds",
)
_QUERY_WORDS = (
    "how",
    "to",
    "best",
    "cheap",
    "near",
    "me",
    "open",
    "now",
    "reset",
    "password",
    "pasta",
    "recipe",
    "weather",
    "tomorrow",
    "train",
    "times",
    "refund",
    "order",
    "battery",
    "life",
    "phone",
    "parking",
    "rules",
    "museum",
    "tickets",
    "football",
    "scores",
    "latency",
    "vector",
    "search",
    "hiking",
    "trail",
    "map",
    "bakery",
    "hours",
    "shipping",
    "cost",
)
_CONNECTORS = ("Meanwhile,", "However,", "In addition,", "As a result,", "Later,", "Still,")


@dataclass(frozen=True)
class LengthMix:
    """Share and word-count range of each kind of text."""

    query_share: float = 0.3
    sentence_share: float = 0.5
    query_words: tuple[int, int] = (3, 10)
    sentence_words: tuple[int, int] = (12, 40)
    passage_words: tuple[int, int] = (50, 150)


def _clause(rng: random.Random) -> str:
    return " ".join(
        (rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS), rng.choice(_TAILS))
    )


def _prose(rng: random.Random, words: int) -> str:
    """Sentences of one or two clauses until ``words`` words, cut to exactly ``words``."""
    sentences: list[str] = []
    count = 0
    while count < words:
        clause = _clause(rng)
        if rng.randrange(3) == 0:
            clause = (
                f"{clause} and {rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
            )
        if sentences and rng.randrange(3) == 0:
            clause = f"{rng.choice(_CONNECTORS)} {clause}"
        sentences.append(clause[0].upper() + clause[1:] + ".")
        count += len(clause.split())
    text = " ".join(" ".join(sentences).split()[:words]).rstrip(".,")
    return text + "."


def _query(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_QUERY_WORDS) for _ in range(words))


def generate(
    size: int = DEFAULT_SIZE, seed: int = DEFAULT_SEED, mix: LengthMix = LengthMix()
) -> list[str]:
    """``size`` texts; the same arguments always give the same list."""
    rng = random.Random(seed)
    texts: list[str] = []
    query_cut = round(mix.query_share * 1000)
    sentence_cut = query_cut + round(mix.sentence_share * 1000)
    for _ in range(size):
        draw = rng.randrange(1000)
        if draw < query_cut:
            texts.append(_query(rng, rng.randint(*mix.query_words)))
        elif draw < sentence_cut:
            texts.append(_prose(rng, rng.randint(*mix.sentence_words)))
        else:
            texts.append(_prose(rng, rng.randint(*mix.passage_words)))
    return texts


def describe(texts: Sequence[str]) -> dict[str, float]:
    """Word-count summary (for reports)."""
    counts = sorted(len(t.split()) for t in texts)
    n = len(counts)
    return {
        "texts": n,
        "mean_words": sum(counts) / n,
        "p50_words": counts[n // 2],
        "p95_words": counts[min(n - 1, int(n * 0.95))],
        "max_words": counts[-1],
    }
