"""``Closing``: ``with`` returns the object and closes it however the block ends."""

from __future__ import annotations

import pytest

from tritonforge.closing import Closing


class Resource(Closing):
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_with_returns_the_object_and_closes_it_once() -> None:
    with Resource() as resource:
        assert resource.closed == 0
    assert resource.closed == 1


def test_an_exception_still_closes_and_propagates() -> None:
    resource = Resource()
    with pytest.raises(KeyError), resource:
        raise KeyError("boom")
    assert resource.closed == 1


def test_a_subclass_must_define_close() -> None:
    class Forgot(Closing):  # abstract on purpose: no close()
        pass

    with pytest.raises(TypeError):
        Forgot()  # type: ignore[abstract]
