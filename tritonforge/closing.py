"""``with obj:`` for objects that end by ``close()``, written once.

:class:`Closing` returns the object on entry and calls its :meth:`~Closing.close` on exit, however
the block ended (the exception, if any, propagates). A subclass defines ``close``; one that starts
something on entry extends ``__enter__`` and returns ``self``.
"""

from __future__ import annotations

import abc
from types import TracebackType
from typing import TypeVar

_Self = TypeVar("_Self", bound="Closing")


class Closing(abc.ABC):
    """Base of the project's context-managed resources: ``__exit__`` is ``close()``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the object holds; called once by ``with``, safe to call directly."""

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
