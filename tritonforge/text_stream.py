"""Generated token ids -> text that is safe to send: no partial UTF-8 character and no prefix of
a stop string (:class:`TextStream`, over :func:`stop_split`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


def stop_split(text: str, stops: Sequence[str]) -> tuple[int, bool]:
    """``(end, stopped)``: ``text[:end]`` is safe to emit. ``stopped``: a stop string occurs and
    ``end`` is where the earliest one starts; otherwise ``end`` holds back the longest tail that
    could still grow into a stop string."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if hits:
        return min(hits), True
    hold = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                hold = max(hold, n)
                break
    return len(text) - hold, False


class Detokenizer(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class TextStream:
    """Generated token ids -> text chunks. Each :meth:`push` returns the new text that is safe to
    send: no partial UTF-8 character (held back while the decode ends in U+FFFD) and no prefix of
    a stop string. ``stopped`` becomes true once a stop string appears (it is not emitted)."""

    def __init__(self, tokenizer: Detokenizer, stops: Sequence[str] = ()) -> None:
        self.tokenizer, self.stops = tokenizer, tuple(stops)
        self.ids: list[int] = []
        self.sent = 0
        self.stopped = False

    def _text(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self._text()
        if text.endswith("\ufffd"):
            return ""
        end, self.stopped = stop_split(text, self.stops)
        return self._advance(text, end)

    def finish(self) -> str:
        """The held-back rest (at the end of generation nothing can complete a stop string)."""
        if self.stopped:
            return ""
        text = self._text()
        end, self.stopped = stop_split(text, self.stops)
        return self._advance(text, end if self.stopped else len(text))

    def _advance(self, text: str, end: int) -> str:
        chunk = text[self.sent : max(end, self.sent)]
        self.sent = max(end, self.sent)
        return chunk


@dataclass(frozen=True)
class StreamInterval:
    """How many tokens one streamed response carries while ``running`` rows decode together
    (vLLM's ``--stream-interval``, adaptive): a response costs about the same whatever it
    carries (the stub's response, Triton's gRPC stream, the client), so under load several
    tokens share one. ``rows_per_token`` rows per token in a response (0: one token per
    response, always), at most ``max_tokens``; the first token always goes alone at once (TTFT)
    and the last response carries whatever is pending with the finish reason."""

    rows_per_token: int = 0
    max_tokens: int = 1

    def __post_init__(self) -> None:
        if self.rows_per_token < 0 or self.max_tokens < 1:
            raise ValueError(
                f"stream_interval_rows must be >= 0 and stream_interval_max_tokens >= 1, got "
                f"{self.rows_per_token} and {self.max_tokens}"
            )

    def tokens(self, running: int) -> int:
        """Tokens per response at ``running`` rows: ``ceil(running / rows_per_token)`` within
        ``[1, max_tokens]``."""
        if self.rows_per_token == 0:
            return 1
        return max(1, min(self.max_tokens, -(-running // self.rows_per_token)))


@dataclass
class PendingText:
    """Text decoded but not sent yet, and the tokens it covers (:class:`StreamInterval`)."""

    text: str = ""
    tokens: int = 0
    sent_any: bool = False

    def add(self, chunk: str, per_response: int) -> str | None:
        """Add one token's ``chunk``; the text to send now (None: keep it pending). A token that
        decodes to no text yet (a partial character, a held-back stop prefix) still counts."""
        self.text += chunk
        self.tokens += 1
        if not self.text or (self.sent_any and self.tokens < per_response):
            return None
        return self.take()

    def take(self) -> str:
        """Everything pending (sent now: the count restarts)."""
        text, self.text, self.tokens, self.sent_any = self.text, "", 0, True
        return text
