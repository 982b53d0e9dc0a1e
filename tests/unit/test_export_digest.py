"""Which code each export's "inputs changed" check covers (``export.staging.task_export_files``):
the shared export machinery and its own task's export code (+ what that imports), never a task's
client, load tests or routes, and never another task's export code."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tritonforge import tasks
from tritonforge.export import staging

NON_EXPORT = ("client.py", "loadtest", "routes.py", "tools.py")


def _digests() -> dict[str, str]:
    """Each task's export-code digest: the shared digest with its export code (what the encoder
    exports record) and the bare list's bytes (what the image and decoder exports hash)."""
    out = {}
    for name in tasks.registry():
        files = staging.task_export_files(name)
        out[name] = staging.code_digest(name) + "".join(str(p.read_bytes()) for _, p in files)
    return out


def test_no_export_digest_covers_a_client_a_load_test_or_routes() -> None:
    for name, task in tasks.registry().items():
        rels = [rel for rel, _ in staging.task_export_files(name)]
        assert f"tasks/{task.folder.name}/__init__.py" in rels
        for rel in rels:
            layer = rel.split("/")[2:3]
            assert not set(layer) & set(NON_EXPORT), f"{name}'s export digest covers {rel}"
    # imports are followed: the decoder's config names the logprobs output of structured/
    assert "tasks/generation/structured/logprobs.py" in dict(
        staging.task_export_files("generation")
    )
    assert "tasks/image/spec.py" in dict(staging.task_export_files("image"))


def test_editing_a_client_or_a_load_test_re_exports_nothing_but_export_code_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "tasks"
    shutil.copytree(staging.TASKS_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(staging, "TASKS_ROOT", copy)
    before = _digests()
    edited = list(copy.glob("*/client.py")) + list(copy.glob("*/loadtest/*.py"))
    edited += list(copy.glob("*/routes.py"))
    assert len(edited) >= 5
    for path in edited:
        path.write_text(path.read_text() + "\n# an edit of the client side\n")
    assert _digests() == before

    (copy / "embedding" / "export.py").write_text("# another embedding export\n")
    after = _digests()
    assert after["embedding"] != before["embedding"]
    assert {k: v for k, v in after.items() if k != "embedding"} == {
        k: v for k, v in before.items() if k != "embedding"
    }
    (copy / "image" / "spec.py").write_text("# another image spec\n")
    assert _digests()["image"] != after["image"]
