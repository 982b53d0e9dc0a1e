"""Write a loop once for the blocking and the asyncio client: as a coroutine that a blocking
caller runs with :func:`finish` (its awaits never suspend) and an asyncio caller awaits."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def finish(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of ``coroutine``, run here to its end without an event loop.

    Its awaits must never suspend (they await only coroutines that block instead), as in the
    blocking client; one that would suspend is a programming error (``RuntimeError``).
    """
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("a blocking call awaited something that suspends: use the asyncio client")
