"""The /v1 completion routes' protocol on the real embedded Triton, independent of the SmolLM2
export: a small decoupled Python model that follows the generate convention (``text_input`` in;
``text_output`` chunks and ``finish_reason`` out) echoes the prompt's words, fails on request,
and records cancellations. The SmolLM2 parity lives in test_openai.py."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from tokenizers import Tokenizer

from tests import tiny_checkpoints
from tritonforge.generation import render_chat
from tritonforge.runtime.launcher.settings import ServerSettings
from tritonforge.runtime.serving import EmbeddedServer

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.integration
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
MODEL = "echo"
MODEL_PY = """
import triton_python_backend_utils as pb_utils

import json
import threading
import time
from pathlib import Path

import numpy as np

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _out(text, reason=None):
    tensors = [pb_utils.Tensor("text_output", np.array([text.encode()], np.object_))]
    if reason:
        tensors.append(pb_utils.Tensor("finish_reason", np.array([reason.encode()], np.object_)))
    return pb_utils.InferenceResponse(output_tensors=tensors)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.marks = Path(config["parameters"]["marks"]["string_value"])

    def execute(self, requests):
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy().reshape(-1)[0]
            params = json.loads(r.parameters() or "{}")
            args = (r.get_response_sender(), text.decode(), params)
            threading.Thread(target=self.run, args=args, daemon=True).start()
        return None

    def run(self, sender, text, params):
        if "OVERLOAD" in text:
            error = pb_utils.TritonError("echo: overloaded (1 running, 1 queued); retry later")
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            return
        (self.marks / "params.json").write_text(json.dumps(params))
        words = (text.split() * 1000)[: int(params.get("max_tokens", 4))]
        for i, word in enumerate(words):
            time.sleep(0.02)
            if sender.is_cancelled():
                (self.marks / "cancelled").write_text("yes")
                sender.send(flags=FINAL)
                return
            if "FAIL" in text and i == 2:
                error = pb_utils.TritonError("echo: decoder step failed (RuntimeError: boom)")
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                return
            last = i == len(words) - 1
            sender.send(_out(word + " ", "length" if last else None), flags=FINAL if last else 0)
"""


@pytest.fixture(scope="module")
def marks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("marks")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, marks: Path) -> Iterator[EmbeddedServer]:
    """The echo model alone, its tokenizer and chat template next to it as generate has them."""
    repo = tmp_path_factory.mktemp("echo-repo")
    version = repo / MODEL / "1"
    version.mkdir(parents=True)
    tokenizer = Tokenizer.from_file(str(tiny_checkpoints.minilm_tokenizer()))
    tokenizer.no_padding()  # as a decoder's tokenizer.json: counts are not padded to 128
    tokenizer.no_truncation()
    tokenizer.save(str(version / "tokenizer.json"))
    (version / "generation.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    (version / "model.py").write_text(MODEL_PY)
    params = {
        "tokenizer_file": "tokenizer.json",
        "generation_file": "generation.json",
        "max_prompt_tokens": "100",
        "max_new_tokens_limit": "5000",
        "marks": str(marks),
    }
    (repo / MODEL / "config.pbtxt").write_text(
        textwrap.dedent(f'''
        name: "{MODEL}"
        backend: "python"
        max_batch_size: 0
        model_transaction_policy {{ decoupled: true }}
        input [
          {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
          {{ name: "stop" data_type: TYPE_STRING dims: [ -1 ] optional: true }}
        ]
        output [
          {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }},
          {{ name: "finish_reason" data_type: TYPE_STRING dims: [ 1 ] }}
        ]
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        ''')
        + "".join(
            f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
            for k, v in params.items()
        )
    )
    with EmbeddedServer(ServerSettings.ephemeral(repo)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: EmbeddedServer) -> Any:
    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="x", max_retries=0)


def _post(server: EmbeddedServer, path: str, body: dict[str, Any], **kw: Any) -> requests.Response:
    return requests.post(f"http://{server.http_url}/v1{path}", json=body, timeout=60, **kw)


def _tokens(server: EmbeddedServer, text: str) -> int:
    path = server.settings.model_repository / MODEL / "1" / "tokenizer.json"
    return len(Tokenizer.from_file(str(path)).encode(text, add_special_tokens=False).ids)


def test_the_generator_is_listed_by_its_tensors(client: Any) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_chat_renders_the_template_and_counts_with_the_served_tokenizer(
    server: EmbeddedServer, client: Any, marks: Path
) -> None:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "one two"}]
    got = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, seed=7)
    prompt = render_chat(messages, TEMPLATE)
    assert got.choices[0].message.content == " ".join(prompt.split()[:3]) + " "
    assert got.choices[0].finish_reason == "length"
    assert got.usage.prompt_tokens == _tokens(server, prompt) > 3
    assert got.usage.completion_tokens == _tokens(server, got.choices[0].message.content)
    sent = json.loads((marks / "params.json").read_text())
    assert sent == {"max_tokens": 3, "seed": 7, "chat_template": False}


def test_stream_events_match_the_non_streamed_answer(server: EmbeddedServer, client: Any) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 4}
    whole = client.chat.completions.create(**body)
    raw = _post(server, "/chat/completions", {**body, "stream": True,
                "stream_options": {"include_usage": True}})  # fmt: skip
    assert raw.status_code == 200 and raw.headers["Content-Type"].startswith("text/event-stream")
    events = [line[6:] for line in raw.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole.choices[0].message.content
    finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finals.count("length") == 1 and finals[-1] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole.usage.model_dump(
        exclude_none=True
    )
    assert all(c["usage"] is None for c in chunks[:-1])


def test_completions_stream(client: Any) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt="x y", max_tokens=3, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "x y x "
    assert chunks[-1].choices[0].finish_reason == "length"


def test_an_error_before_any_text_gets_its_status(server: EmbeddedServer) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "OVERLOAD"}], "stream": True}
    r = _post(server, "/chat/completions", body)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert r.json()["error"]["type"] == "server_error" and "overloaded" in r.text


def test_an_error_mid_stream_is_an_event_then_done(server: EmbeddedServer) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "FAIL now"}], "stream": True,
            "max_tokens": 10}  # fmt: skip
    r = _post(server, "/chat/completions", body)
    events = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert r.status_code == 200 and events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "decoder step failed" in error["message"] and error["type"] == "server_error"


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_cancels_the_request(
    server: EmbeddedServer, marks: Path, stream: bool
) -> None:
    (marks / "cancelled").unlink(missing_ok=True)
    body = {"model": MODEL, "prompt": "w", "max_tokens": 4000, "stream": stream}
    if stream:
        response = _post(server, "/completions", body, stream=True)
        lines = response.iter_lines()
        assert next(lines).startswith(b"data: ")
        response.close()
    else:
        with pytest.raises(requests.ReadTimeout):  # 4000 words take 80 s; leave after 1
            requests.post(f"http://{server.http_url}/v1/completions", json=body, timeout=1)
    deadline = time.monotonic() + 30
    while not (marks / "cancelled").exists():
        assert time.monotonic() < deadline, "the abandoned request was never cancelled"
        time.sleep(0.1)
