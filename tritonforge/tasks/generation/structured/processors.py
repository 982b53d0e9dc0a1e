"""A row's logits processors (pure numpy): ``logit_bias``, presence/frequency penalties and the
grammar mask, chained in :class:`RowChain` (the scheduler's ``Generation.processing``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from tritonforge.tasks.generation.structured.logprobs import LogprobRecorder


class Processor(Protocol):
    def apply(self, logits: np.ndarray) -> None:
        """Change ``logits`` ([vocab] float) in place."""

    def accept(self, token: int) -> None:
        """The token chosen from this row."""


class LogitBias:
    """OpenAI's ``logit_bias``: a value in [-100, 100] added to each named token's logit."""

    def __init__(self, bias: Mapping[int, float]) -> None:
        self.ids = np.fromiter(bias.keys(), np.int64, len(bias))
        self.values = np.fromiter(bias.values(), np.float32, len(bias))

    def apply(self, logits: np.ndarray) -> None:
        logits[self.ids] += self.values

    def accept(self, token: int) -> None:
        pass


class Penalties:
    """OpenAI's ``presence_penalty`` and ``frequency_penalty`` over the tokens generated so far:
    ``logit[j] -= count[j] * frequency + (count[j] > 0) * presence``."""

    def __init__(self, presence: float, frequency: float) -> None:
        self.presence, self.frequency = presence, frequency
        self.counts: dict[int, int] = {}

    def apply(self, logits: np.ndarray) -> None:
        if not self.counts:
            return
        ids = np.fromiter(self.counts.keys(), np.int64, len(self.counts))
        counts = np.fromiter(self.counts.values(), np.float32, len(self.counts))
        logits[ids] -= counts * self.frequency + self.presence

    def accept(self, token: int) -> None:
        self.counts[token] = self.counts.get(token, 0) + 1


class RowChain:
    """One row's processors, applied in order to a float32 copy of its logits (the grammar mask
    last, so no bias can revive a forbidden token), plus an optional logprob recorder that sees
    the raw logits (the model's distribution, as OpenAI reports it)."""

    def __init__(
        self, processors: list[Processor], logprobs: LogprobRecorder | None = None
    ) -> None:
        self.processors, self.logprobs = processors, logprobs

    def process(self, logits: np.ndarray) -> np.ndarray:
        if not self.processors:
            return logits
        out = np.array(logits, dtype=np.float32, copy=True)
        for p in self.processors:
            p.apply(out)
        return out

    def accept(self, token: int, logits: np.ndarray) -> None:
        for p in self.processors:
            p.accept(token)
        if self.logprobs is not None:
            self.logprobs.record(token, logits)
