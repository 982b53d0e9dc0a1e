"""The demo's own clients end with it: an open generation client in the launcher's process kept
``generate`` live at shutdown (Ctrl-C of ``make run`` waited out Triton's 30 s exit timeout and
tritonserver exited 1; measured on the real demo before the fix, exit 0 in seconds after)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from tritonforge.client import generate
from tritonforge.runtime.cli import demo


class Recorder:
    """Stands in for :class:`GenerateClient` (no server here): records whether it was closed."""

    instances: ClassVar[list[Recorder]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.closed = False
        self.last_finish_reason: str | None = None
        Recorder.instances.append(self)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.closed = True

    def generate(self, prompt: str, stream: bool = True, **sampling: Any) -> Iterator[str]:
        self.last_finish_reason = "stop"
        yield from ("An ", "answer.")


def test_the_demo_closes_its_generation_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generate, "GenerateClient", Recorder)
    server = SimpleNamespace(grpc_url="127.0.0.1:1")
    assert demo.stream_answer(server) == "An answer."  # type: ignore[arg-type]
    (client,) = Recorder.instances
    assert client.closed
