"""Triton's HTTP API as the launcher uses it: readiness, and the model-repository extension
(load / reload, with the admin header that unlocks the restricted APIs)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping

from tritonforge.runtime.errors import ModelLoadError


def is_ready(http_url: str, timeout_s: float = 2.0) -> bool:
    """Whether ``/v2/health/ready`` at ``host:port`` answers 200 within ``timeout_s``."""
    try:
        url = f"http://{http_url}/v2/health/ready"
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


class RepositoryAPI:
    """The model-repository API of the server at ``http_url`` (``host:port``)."""

    def __init__(self, http_url: str, admin_headers: Mapping[str, str]) -> None:
        self.http_url = http_url
        self.admin_headers = dict(admin_headers)

    def call(self, path: str, body: bytes = b"{}", timeout_s: float = 120.0) -> str:
        """POST to ``/v2/repository/<path>``; returns Triton's error text, or "" on success."""
        request = urllib.request.Request(
            f"http://{self.http_url}/v2/repository/{path}",
            data=body,
            method="POST",
            headers={**self.admin_headers, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s):
                return ""
        except urllib.error.HTTPError as e:
            return e.read().decode("utf-8", "replace") or str(e)

    def model_config(self, model: str, timeout_s: float = 10.0) -> str:
        """The served config of ``model`` as Triton's JSON text."""
        request = urllib.request.Request(
            f"http://{self.http_url}/v2/models/{model}/config", headers=self.admin_headers
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return str(resp.read().decode())

    def load_model(self, model: str, timeout_s: float = 120.0, force: bool = False) -> None:
        """(Re)load ``model`` (explicit model control only).

        Triton loads the new instances before it retires the old ones, so requests keep being
        served; raises :class:`ModelLoadError` with Triton's error when the load fails (the
        versions already serving stay). Triton skips a load when nothing changed on disk;
        ``force`` passes the current config as an override so the instances are rebuilt (what a
        crashed stub needs).
        """
        body = b"{}"
        if force:
            body = json.dumps({"parameters": {"config": self.model_config(model)}}).encode()
        error = self.call(f"models/{model}/load", body=body, timeout_s=timeout_s)
        if error:
            raise ModelLoadError({model: error})
