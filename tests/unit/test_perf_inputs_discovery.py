"""``make perf`` discovers its models from the repository's configs: a pipeline added later (here a
made-up classifier ensemble and a decoupled model) gets input files with no change to the code."""

from __future__ import annotations

import io
import json
from pathlib import Path

from tritonforge.loadtest.perf_analyzer import inputs as perf_inputs

CONFIGS = {
    "classify": """
name: "classify"
platform: "ensemble"
max_batch_size: 8
input [ { name: "review" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "label" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "classify_head" model_version: -1
    input_map { key: "review" value: "review" } output_map { key: "label" value: "label" } }
] }
""",
    "classify_head": """
name: "classify_head"
backend: "python"
max_batch_size: 8
input [ { name: "review" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "label" data_type: TYPE_STRING dims: [ 1 ] } ]
""",
    "chat": """
name: "chat"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "prompt" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "history" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true }
]
output [ { name: "reply" data_type: TYPE_STRING dims: [ 1 ] } ]
""",
}


def test_new_pipelines_are_discovered_from_their_configs(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name, text in CONFIGS.items():
        (repo / name).mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(text)
    out = tmp_path / "perf"
    targets = perf_inputs.write_inputs(repo, out, ["great film", "dull"], rows=2)
    # the ensemble's step is internal; the two entry points are measured
    assert {t.model: t.decoupled for t in targets} == {"chat": True, "classify": False}
    classify = json.loads((out / "classify.json").read_text())["data"]
    assert classify == [{"review": ["great film"]}, {"review": ["dull"]}]
    chat = json.loads((out / "chat.json").read_text())["data"]
    # required inputs only; a dynamic dim gets content + shape
    assert chat[0] == {"prompt": ["great film"], "history": {"content": [1], "shape": [1]}}
    command = perf_inputs.perf_command("perf_analyzer", targets[0], "h:8001", None)
    assert "--streaming" in command and "chat" in command


def test_an_image_model_gets_photos_in_tritons_bytes_serialization(tmp_path: Path) -> None:
    """An image task's BYTES input is filled with its sample photos (the task's perf_items), as
    perf_analyzer's b64 of Triton's serialization (length + bytes), not with corpus text."""
    import base64
    import struct

    from PIL import Image

    from tritonforge.tasks.image.loadtest import perf_items

    repo = tmp_path / "repo"
    (repo / "cnn").mkdir(parents=True)
    (repo / "cnn" / "config.pbtxt").write_text(
        CONFIGS["classify_head"]
        .replace("classify_head", "cnn")
        .replace('"review"', '"image"')
        .replace("max_batch_size: 8", 'max_batch_size: 8\nparameters { key: "tritonforge.task" '
                 'value: { string_value: "image" } }')
    )  # fmt: skip
    photos = perf_items()
    assert photos and all(Image.open(io.BytesIO(p)).format in ("JPEG", "PNG") for p in photos)
    targets = perf_inputs.write_inputs(repo, tmp_path / "perf", ["text"], rows=500)
    data = json.loads(targets[0].path.read_text())["data"]
    assert len(data) == len(photos)  # each photo once, not 500 rows of them
    raw = base64.b64decode(data[0]["image"]["b64"])
    (length,) = struct.unpack("<I", raw[:4])
    assert raw[4:] == photos[0] and length == len(photos[0])
