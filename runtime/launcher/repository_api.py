"""Triton's HTTP API as the launcher uses it: readiness, and the model-repository extension
(load / reload, with the admin header that unlocks the restricted APIs).

Behind the front, the launcher talks to Triton's private HTTP socket directly (``unix_socket``):
its own connection, so a flood that holds every upstream connection of the front cannot starve
readiness checks and model reloads."""

from __future__ import annotations

import http.client
import json
import secrets
import socket
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from tritonforge.runtime.errors import ModelLoadError

RELOAD_KEY = "tritonforge.reload_id"
"""Config parameter a forced reload sets to a fresh value: Triton 2.51 skips a load whose config
override equals the served config (0.003 s, the dead stub stays dead), so the override must
differ. No model reads it."""


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (the ``host`` is only the ``Host`` header)."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        super().__init__("localhost", timeout=timeout_s)
        self.path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def unix_request(
    path: Path,
    method: str,
    target: str,
    timeout_s: float,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, bytes]:
    """(status, body) of one request to the HTTP server on Unix socket ``path``; raises OSError
    when it does not answer."""
    conn = _UnixConnection(path, timeout_s)
    try:
        conn.request(method, target, body=body, headers=dict(headers or {}))
        response = conn.getresponse()
        return response.status, response.read()
    except http.client.HTTPException as e:
        raise OSError(f"bad answer from {path}: {e}") from e
    finally:
        conn.close()


def is_ready(http_url: str, timeout_s: float = 2.0, unix_socket: Path | None = None) -> bool:
    """Whether ``/v2/health/ready`` at ``host:port`` (or on ``unix_socket``) answers 200 within
    ``timeout_s``."""
    try:
        if unix_socket is not None:
            return unix_request(unix_socket, "GET", "/v2/health/ready", timeout_s)[0] == 200
        url = f"http://{http_url}/v2/health/ready"
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


class RepositoryAPI:
    """The model-repository API of the server at ``http_url`` (``host:port``), or on its private
    ``unix_socket`` when given."""

    def __init__(
        self, http_url: str, admin_headers: Mapping[str, str], unix_socket: Path | None = None
    ) -> None:
        self.http_url = http_url
        self.admin_headers = dict(admin_headers)
        self.unix_socket = unix_socket

    def _send(
        self, method: str, target: str, body: bytes | None, timeout_s: float
    ) -> tuple[int, bytes]:
        headers = {**self.admin_headers, "Content-Type": "application/json"}
        if self.unix_socket is not None:
            return unix_request(self.unix_socket, method, target, timeout_s, body, headers)
        request = urllib.request.Request(
            f"http://{self.http_url}{target}", data=body, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read()

    def call(self, path: str, body: bytes = b"{}", timeout_s: float = 120.0) -> str:
        """POST to ``/v2/repository/<path>``; returns Triton's error text, or "" on success."""
        status, answer = self._send("POST", f"/v2/repository/{path}", body, timeout_s)
        if status == 200:
            return ""
        return answer.decode("utf-8", "replace") or f"HTTP {status}"

    def model_config(self, model: str, timeout_s: float = 10.0) -> str:
        """The served config of ``model`` as Triton's JSON text."""
        status, answer = self._send("GET", f"/v2/models/{model}/config", None, timeout_s)
        if status != 200:
            raise ModelLoadError({model: answer.decode("utf-8", "replace") or f"HTTP {status}"})
        return answer.decode()

    def load_model(self, model: str, timeout_s: float = 120.0, force: bool = False) -> None:
        """(Re)load ``model`` (explicit model control only).

        Triton loads the new instances before it retires the old ones, so requests keep being
        served; raises :class:`ModelLoadError` with Triton's error when the load fails (the
        versions already serving stay). Triton skips a load when nothing changed on disk, and
        also when a config override equals the served config; ``force`` passes the current
        config with a fresh :data:`RELOAD_KEY` parameter as an override, so the instances are
        rebuilt (what a crashed stub needs).
        """
        body = b"{}"
        if force:
            config = json.loads(self.model_config(model))
            parameters = config.setdefault("parameters", {})
            parameters[RELOAD_KEY] = {"string_value": secrets.token_hex(8)}
            body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
        error = self.call(f"models/{model}/load", body=body, timeout_s=timeout_s)
        if error:
            raise ModelLoadError({model: error})
