"""The generation bench's /v1 cell picks the route a served decoder answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tritonforge.loadtest.bench.generate import has_chat_template


@pytest.mark.parametrize(("template", "chat"), [("{{ messages }}", True), (None, False)])
def test_a_decoder_without_a_chat_template_is_benched_on_completions(
    tmp_path: Path, template: str | None, chat: bool
) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "generation.json").write_text(json.dumps({"chat_template": template}))
    assert has_chat_template(tmp_path) is chat
