"""Token logprobs from a row's raw logits (log_softmax in float64) and their OpenAI shapes:
chat ``logprobs.content[].{token, logprob, bytes, top_logprobs}`` and the completions'
``{tokens, token_logprobs, top_logprobs, text_offset}``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

MAX_TOP_LOGPROBS = 20
# The generate model's optional output: a chunk's token logprobs as JSON (:func:`entries_json`).
LOGPROBS_OUTPUT = "logprobs"


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob), most likely first


def token_logprob(logits: np.ndarray, token: int, top_n: int) -> TokenLogprob:
    """``token``'s log-probability under softmax(``logits``) and the ``top_n`` most likely."""
    x = logits.astype(np.float64)
    peak = x.max()
    lse = float(peak + np.log(np.exp(x - peak).sum()))
    top: tuple[tuple[int, float], ...] = ()
    if top_n > 0:  # the order is the raw logits' (float64 keeps it): select on them, cheaper
        best = np.argpartition(logits, logits.shape[0] - top_n)[-top_n:]
        best = best[np.lexsort((best, -x[best]))]
        top = tuple((int(i), float(x[i]) - lse) for i in best)
    return TokenLogprob(int(token), float(x[token]) - lse, top)


@dataclass
class LogprobRecorder:
    """Records each chosen token's logprob (and ``top_n`` alternatives) of one row."""

    top_n: int = 0
    entries: list[TokenLogprob] = field(default_factory=list)
    sent: int = 0  # entries already handed out by :meth:`take`

    def record(self, token: int, logits: np.ndarray) -> None:
        self.entries.append(token_logprob(logits, token, self.top_n))

    def take(self, upto: int) -> list[TokenLogprob]:
        """The entries not taken yet, up to ``upto`` (the row's emitted token count: the stop
        token's entry, recorded before the scheduler knew, is left out as OpenAI does)."""
        out = self.entries[self.sent : upto]
        self.sent = max(self.sent, min(upto, len(self.entries)))
        return out


def entries_json(entries: list[TokenLogprob]) -> str:
    """``entries`` as compact JSON, ``[[token, logprob, [[id, logprob], ...]], ...]``."""
    return json.dumps(
        [[e.token, e.logprob, [list(t) for t in e.top]] for e in entries], separators=(",", ":")
    )


def entries_from_json(text: str) -> list[TokenLogprob]:
    """:func:`entries_json`'s inverse; ValueError when ``text`` is not its shape."""
    try:
        return [
            TokenLogprob(int(t), float(lp), tuple((int(i), float(x)) for i, x in top))
            for t, lp, top in json.loads(text)
        ]
    except (TypeError, KeyError) as e:
        raise ValueError(f"not a logprobs list ({e})") from e


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed (char -> byte)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def token_bytes(tokenizer: Any, token: int) -> bytes:
    """A token's bytes: its byte-level (GPT-2 alphabet) spelling mapped back, else its decoding."""
    piece = tokenizer.id_to_token(token)
    table = _byte_decoder()
    if piece is not None and all(ch in table for ch in piece):
        return bytes(table[ch] for ch in piece)
    return str(tokenizer.decode([token], skip_special_tokens=False)).encode("utf-8")


def _entry(tokenizer: Any, token: int, logprob: float) -> dict[str, Any]:
    raw = token_bytes(tokenizer, token)
    return {
        "token": raw.decode("utf-8", errors="replace"),
        "logprob": logprob,
        "bytes": list(raw),
    }


def chat_logprobs(tokenizer: Any, entries: list[TokenLogprob]) -> dict[str, Any]:
    """The chat completion choice's ``logprobs`` object."""
    return {
        "content": [
            {
                **_entry(tokenizer, e.token, e.logprob),
                "top_logprobs": [_entry(tokenizer, t, lp) for t, lp in e.top],
            }
            for e in entries
        ]
    }


def completion_logprobs(
    tokenizer: Any, entries: list[TokenLogprob], text_offset: int = 0
) -> dict[str, Any]:
    """The (legacy) completion choice's ``logprobs`` object; offsets count characters from
    ``text_offset`` (the prompt's length when it is echoed, else 0)."""
    tokens = [token_bytes(tokenizer, e.token).decode("utf-8", errors="replace") for e in entries]
    offsets, at = [], text_offset
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [
            {token_bytes(tokenizer, t).decode("utf-8", errors="replace"): lp for t, lp in e.top}
            for e in entries
        ],
        "text_offset": offsets,
    }
