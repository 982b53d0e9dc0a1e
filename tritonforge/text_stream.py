"""Generated token ids -> text that is safe to send: no partial UTF-8 character and no prefix of
a stop string (:class:`TextStream`, over :func:`stop_split`)."""

from __future__ import annotations

from collections.abc import Sequence
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
