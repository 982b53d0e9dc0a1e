"""Defensive parsing of what clients send to the front, and a log that cannot be flooded.

Every header and parameter the front reads goes through these: a bad value is a
:class:`FrontError` (400) naming the field, and no message echoes more than :data:`ECHO_BYTES`
bytes of what was sent. Errors the front answers are logged by :class:`ThrottledLog`: the first of
each kind at once, then one line per kind per interval with the count, never one traceback per
request.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tritonforge.errors import InvalidInputError, shown
from tritonforge.generation import (
    CACHE_SALT_PARAMETER,
    QUEUE_PRIORITY_PARAMETER,
    cache_salt,
)
from tritonforge.runtime.errors import FrontError
from tritonforge.runtime.front.queues import QueueAdmission

_ASCII_DIGITS = re.compile(r"[0-9]+")
MAX_LENGTH_DIGITS = 12  # a length above 10**12 bytes is never within a bounded body
MAX_VERSION_DIGITS = 9  # model versions are int64 in Triton; the BLS pins small numbers


def parse_decimal(value: str, field: str, max_digits: int, minimum: int = 0) -> int:
    """A non-negative ASCII decimal of at most ``max_digits`` digits and at least ``minimum``.

    ``str.isdigit`` accepts ``'²'`` (which ``int`` then refuses) and ``int`` parses 5000 digits
    slowly; this accepts neither. Raises :class:`FrontError` (400) naming ``field``.
    """
    stripped = value.strip()
    if not _ASCII_DIGITS.fullmatch(stripped) or len(stripped.lstrip("0") or "0") > max_digits:
        raise FrontError(
            f"{field} must be an integer of at most {max_digits} digits, got {shown(value)}", 400
        )
    number = int(stripped)
    if number < minimum:
        raise FrontError(f"{field} must be at least {minimum}, got {number}", 400)
    return number


def parse_header_length(value: str, body_bytes: int, field: str) -> int:
    """``Inference-Header-Content-Length``: a length within the body (400 otherwise)."""
    length = parse_decimal(value, field, MAX_LENGTH_DIGITS)
    if length > body_bytes:
        raise FrontError(
            f"{field} {length} is not a length within the body ({body_bytes} bytes)", 400
        )
    return length


def parse_version(value: str, field: str) -> int:
    """A model version to pin: a positive integer (400 naming ``field`` otherwise)."""
    return parse_decimal(value, field, MAX_VERSION_DIGITS, minimum=1)


@dataclass
class _Kind:
    first_s: float
    count: int = 0  # since the last line written


class ThrottledLog:
    """Logs each kind of error once per ``interval_s``: the first occurrence at once, later ones
    as a single line with their count when the interval has passed (at the next occurrence, or
    :meth:`flush`). ``clock`` is injectable for tests."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        level: int = logging.WARNING,
    ) -> None:
        self.logger, self.interval_s, self.clock, self.level = logger, interval_s, clock, level
        self._kinds: dict[str, _Kind] = {}
        self._lock = threading.Lock()

    def record(self, kind: str, message: str) -> None:
        """One occurrence of ``kind`` (keep kinds few: a status and a field, never client data)."""
        now = self.clock()
        with self._lock:
            seen = self._kinds.get(kind)
            if seen is None:
                self._kinds[kind] = _Kind(now)
                line: str | None = f"{kind}: {message}"
            else:
                seen.count += 1
                line = None
                if now - seen.first_s >= self.interval_s:
                    line = self._summary(kind, seen, now, message)
        if line is not None:
            self.logger.log(self.level, "%s", line)

    def _summary(self, kind: str, seen: _Kind, now: float, message: str) -> str:
        line = (
            f"{kind}: {seen.count} more in the last {now - seen.first_s:.0f} s (latest: {message})"
        )
        seen.first_s, seen.count = now, 0
        return line

    def flush(self) -> None:
        """Write the pending counts (at shutdown)."""
        now = self.clock()
        with self._lock:
            lines = [
                self._summary(kind, seen, now, "-")
                for kind, seen in self._kinds.items()
                if seen.count
            ]
        for line in lines:
            self.logger.log(self.level, "%s", line)

    def pending(self, kind: str) -> int:
        """Occurrences of ``kind`` not yet written (tests)."""
        with self._lock:
            seen = self._kinds.get(kind)
            return seen.count if seen else 0


class ServerErrorLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger (``web.Server(logger=...)``) through a :class:`ThrottledLog`.

    aiohttp's HTTP parser refuses a malformed request (bad request line, header without a
    colon, duplicate ``Content-Length``, oversized header, bad chunk) with a 400 and logs it
    in ``RequestHandler.handle_error`` as ``aiohttp.server`` ERROR with the full traceback, one
    per request: a flood of them filled the log. Here each is one occurrence of the kind
    ``http <status> <exception type>`` (a few fixed kinds, never client data), its message cut
    to :data:`ECHO_BYTES`; debug records pass through to ``aiohttp.server`` unchanged."""

    def __init__(self, errors: ThrottledLog) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.errors = errors

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if level < logging.WARNING:
            super().log(level, msg, *args, **kwargs)
            return
        exc_info = kwargs.get("exc_info")
        if exc_info is True:
            exc_info = sys.exc_info()[1]
        elif isinstance(exc_info, tuple):
            exc_info = exc_info[1]
        try:
            text = str(msg) % args if args else str(msg)
        except (TypeError, ValueError):
            text = str(msg)
        if not isinstance(exc_info, BaseException):
            self.errors.record("http server", text)
            return
        status = getattr(exc_info, "code", None) or getattr(exc_info, "status", None) or 500
        detail = getattr(exc_info, "message", None) or str(exc_info)
        self.errors.record(f"http {status} {type(exc_info).__name__}", f"{text}: {shown(detail)}")


def admin_ok(given: str | None, key: str) -> bool:
    """Whether ``given`` is the admin ``key`` (a constant-time compare)."""
    return given is not None and hmac.compare_digest(given.encode(), key.encode())


MAX_MODEL_NAME_BYTES = 256
"""Longer model names are refused before Triton echoes them back in its error."""


def check_model_name(name: str, field: str = "model name") -> None:
    """Raise :class:`FrontError` (400) for a model name over :data:`MAX_MODEL_NAME_BYTES`."""
    size = len(name.encode("utf-8", "replace"))
    if size > MAX_MODEL_NAME_BYTES:
        raise FrontError(
            f"{field} is {size} bytes; at most {MAX_MODEL_NAME_BYTES} allowed: {shown(name)}", 400
        )


@dataclass
class OpenStream:
    """One open stream: how to end it, when it opened (``time.monotonic``) and the models its
    requests went to (an SSE stream has one; a gRPC stream may name several). ``slot``: whether
    it holds stream slots (a non-streamed ``/v1`` generation is tracked, so that the supervisor
    can end it, but holds none)."""

    end: Callable[[str], None]
    opened_s: float
    models: set[str]
    slot: bool = True


def stream_capacities(configs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many requests each decoupled model of ``configs`` admits at once: its running plus
    queued sequences (the ``max_running`` and ``max_queue`` parameters its engine reads; a
    request past them is refused anyway). Models that declare neither are left out."""
    out: dict[str, int] = {}
    for config in configs:
        policy = config.get("model_transaction_policy") or {}
        if not (isinstance(policy, Mapping) and policy.get("decoupled")):
            continue
        params = _parameters(config)
        try:
            capacity = int(params["max_running"]) + int(params["max_queue"])
        except (KeyError, ValueError):
            continue
        if capacity > 0:
            out[str(config.get("name", ""))] = capacity
    return out


class Admission:
    """What the front lets through: every request while accepting, and long-lived streams (SSE,
    gRPC, ``/v1``) within a bound **per model**: ``min(max_open_streams, what the model's config
    admits)`` (:func:`stream_capacities`, set by the front from the served configs), so a flood
    of streams to one model never refuses another; gRPC streams that named no model yet are
    bounded by ``max_open_streams`` together. On drain, nothing new, and every open stream is
    ended with the reason. Used from the front's event loop only."""

    def __init__(self, max_open_streams: int) -> None:
        self.max_open_streams = max_open_streams
        self.capacities: dict[str, int] = {}  # per decoupled model, from the served configs
        # short inferences per model within its queues' bounds (runtime.front.queues)
        self.queues = QueueAdmission()
        self.draining: str | None = None  # the reason, once draining
        self.short = 0  # short requests in flight
        self._streams: dict[int, OpenStream] = {}
        self._next = 0

    @property
    def open_streams(self) -> int:
        return sum(1 for s in self._streams.values() if s.slot)

    def bound(self, model: str) -> int:
        """The most streams ``model`` may hold open at once."""
        return min(self.max_open_streams, self.capacities.get(model, self.max_open_streams))

    def holding(self, model: str | None) -> int:
        """Open streams to ``model`` (None: those that named no model yet)."""
        return sum(
            1
            for s in self._streams.values()
            if s.slot and (model in s.models if model is not None else not s.models)
        )

    def _full(self, model: str | None) -> bool:
        limit = self.max_open_streams if model is None else self.bound(model)
        return self.holding(model) >= limit

    def open_stream(self, end: Callable[[str], None], model: str | None = None) -> int | None:
        """A slot for a stream (``end(reason)`` ends it on drain or :meth:`end_streams`); None
        past the bound of ``model`` (where it goes, when known at once: SSE, ``/v1``)."""
        if self._full(model):
            return None
        self._next += 1
        self._streams[self._next] = OpenStream(end, time.monotonic(), {model} if model else set())
        return self._next

    def track(self, end: Callable[[str], None], model: str) -> int:
        """Register a request in flight to ``model`` that holds no stream slot (a non-streamed
        ``/v1`` generation), so that :meth:`end_streams` and the drain end it too."""
        self._next += 1
        self._streams[self._next] = OpenStream(end, time.monotonic(), {model}, slot=False)
        return self._next

    def stream_model(self, token: int | None, model: str) -> bool:
        """Record that stream ``token`` sent a request to ``model``; False (nothing recorded)
        when ``model`` already holds its bound of streams (the caller refuses the request with
        :meth:`full_message`)."""
        stream = self._streams.get(token) if token is not None else None
        if stream is None or model in stream.models:
            return True
        if self._full(model):
            return False
        stream.models.add(model)
        return True

    def close_stream(self, token: int | None) -> None:
        if token is not None:
            self._streams.pop(token, None)

    def end_streams(
        self, models: Iterable[str], reason: str, opened_before_s: float | None = None
    ) -> int:
        """End every open stream (and tracked request) that sent a request to one of
        ``models`` (and opened before ``opened_before_s``, a ``time.monotonic`` value, when
        given) with ``reason``; how many. A decoupled model whose stub died never sends the
        final response of the requests it held: without this their clients would wait forever."""
        wanted = set(models)
        ended = 0
        for stream in list(self._streams.values()):
            if not stream.models & wanted:
                continue
            if opened_before_s is not None and stream.opened_s >= opened_before_s:
                continue
            stream.end(reason)
            ended += 1
        return ended

    def full_message(self, model: str | None = None) -> str:
        """Why a stream to ``model`` was refused, naming the model and its bound."""
        if model is None:
            return (
                f"{self.holding(None)} streams open that named no model yet "
                f"(max_open_streams={self.max_open_streams}); retry later"
            )
        declared = self.capacities.get(model)
        why = f"max_open_streams={self.max_open_streams} per model"
        if declared is not None:
            why += f"; its config admits {declared}: max_running + max_queue"
        return (
            f"{model}: overloaded: {self.holding(model)} streams open, its bound is "
            f"{self.bound(model)} "
            f"({why}); retry later"
        )

    def begin_drain(self, reason: str) -> None:
        """Refuse new requests from now on and end the open streams with ``reason``."""
        self.draining = reason
        for stream in list(self._streams.values()):
            stream.end(reason)

    def idle(self) -> bool:
        return self.short == 0 and not self._streams

    def metrics(self) -> str:
        """Prometheus text: the open streams and the bound per model, short requests in flight,
        the queues' bounds and refusals (:meth:`QueueAdmission.metrics`)."""
        per_model: dict[str, int] = {m: 0 for m in self.capacities}
        for stream in list(self._streams.values()):
            if stream.slot:
                for model in stream.models:
                    per_model[model] = per_model.get(model, 0) + 1
        lines = [
            "# HELP tritonforge_front_open_streams Streams open through the front, per model "
            "(SSE generate_stream, gRPC ModelStreamInfer, /v1 streams; all over gRPC to Triton).",
            "# TYPE tritonforge_front_open_streams gauge",
            *(
                f'tritonforge_front_open_streams{{model="{_label(m)}"}} {n}'
                for m, n in sorted(per_model.items())
            ),
            "# HELP tritonforge_front_stream_bound The most streams a model may hold open.",
            "# TYPE tritonforge_front_stream_bound gauge",
            *(
                f'tritonforge_front_stream_bound{{model="{_label(m)}"}} {self.bound(m)}'
                for m in sorted(per_model)
            ),
            "# HELP tritonforge_front_short_requests Short requests in flight through the front.",
            "# TYPE tritonforge_front_short_requests gauge",
            f"tritonforge_front_short_requests {self.short}",
            *self.queues.metrics(_label),
        ]
        return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    """A Prometheus label value (escaped, bounded)."""
    return value[:128].replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# aiohttp request storage the tenants' gate fills for the relays (never anything a client sends):
QUEUE_PRIORITY_KEY = web.RequestKey("tritonforge.queue_priority", int)  # the tenant's (1 first)
TENANT_KEY = web.RequestKey("tritonforge.tenant", str)  # the tenant's name: its cache salt
# the /v1 routes append a completion's (prompt, completion) tokens here
USAGE_KEY = web.RequestKey("tritonforge.usage", list[tuple[int, int]])


def note_usage(request: web.BaseRequest, prompt_tokens: int, completion_tokens: int) -> None:
    """Note one answer's tokens for the tenants' gate (:data:`USAGE_KEY`; nothing when it is off)."""
    used = request.get(USAGE_KEY)
    if isinstance(used, list):
        used.append((prompt_tokens, completion_tokens))


def set_queue_priority(message: Any, priority: int | None) -> None:
    """Put the tenant's ``priority`` on a gRPC ``ModelInferRequest`` as the generate model's
    :data:`~tritonforge.generation.QUEUE_PRIORITY_PARAMETER` (None: none). The parameter is the
    server's to set: a request that carries one is refused (400 naming it)."""
    if QUEUE_PRIORITY_PARAMETER in message.parameters:
        raise FrontError(
            f"request parameter {QUEUE_PRIORITY_PARAMETER!r} is set by the server from the "
            f"tenant's priority; leave it out",
            400,
        )
    if priority is not None and priority > 0:
        message.parameters[QUEUE_PRIORITY_PARAMETER].int64_param = priority


def tenant_salt(tenant: str, own: str) -> str:
    """The prefix-cache salt of a tenant's request that sent ``own`` ("" when none): a digest
    of both, so no client of another tenant can send it (the tenant is always part of it) and
    a tenant's own salts still split its cache."""
    return hashlib.sha256(json.dumps([tenant, own]).encode()).hexdigest()


def set_cache_salt(message: Any, tenant: str | None) -> None:
    """With tenants (``tenant`` not None), replace a gRPC ``ModelInferRequest``'s
    :data:`~tritonforge.generation.CACHE_SALT_PARAMETER` with :func:`tenant_salt` of the tenant
    and the client's own, so tenants never share a generate model's prefix cache (whose time
    to first token would tell one tenant what another's recent prompts began with). Without
    tenants the client's salt goes on as sent. A salt
    :func:`~tritonforge.generation.cache_salt` refuses: 400 naming it."""
    if tenant is None:
        return
    own: Any = ""
    if CACHE_SALT_PARAMETER in message.parameters:
        param = message.parameters[CACHE_SALT_PARAMETER]
        # whichever kind the client sent (string, int64, bool, ...): cache_salt() alone
        # judges it, so a salt of the wrong type gets the same 400 as on the other routes
        own = getattr(param, param.WhichOneof("parameter_choice") or "string_param")
    try:
        own = cache_salt({CACHE_SALT_PARAMETER: own})
    except InvalidInputError as e:
        raise FrontError(f"request parameter {e}", 400) from e
    message.parameters[CACHE_SALT_PARAMETER].string_param = tenant_salt(tenant, own)


VERSION_PARAMETER = "version"  # the request parameter the BLS pins a version with
# The first seed's header: pins a model version of a BLS pipeline (request parameter `version`).
VERSION_HEADER = "X-Model-Version"
LENGTH_HEADER = "Inference-Header-Content-Length"


def _parameters(config: Mapping[str, Any]) -> dict[str, str]:
    raw = config.get("parameters") or {}
    if not isinstance(raw, Mapping):
        return {}
    return {
        str(k): str(v.get("string_value", "")) if isinstance(v, Mapping) else str(v)
        for k, v in raw.items()
    }


@dataclass(frozen=True)
class PinPolicy:
    """Which served models honour a version pin (``X-Model-Version`` / request parameter
    ``version``): those whose config declares several ``versions`` (the BLS pipelines with A/B
    versions), read from the configs, never restated."""

    pinnable: frozenset[str]
    known: frozenset[str]

    @classmethod
    def from_configs(cls, configs: Iterable[Mapping[str, Any]]) -> PinPolicy:
        pinnable, known = set(), set()
        for config in configs:
            name = str(config.get("name", ""))
            known.add(name)
            versions = [v for v in _parameters(config).get("versions", "").split(",") if v.strip()]
            if len(versions) > 1:
                pinnable.add(name)
        return cls(frozenset(pinnable), frozenset(known))

    def check(self, model: str, field: str) -> None:
        """Raise :class:`FrontError` (400) when ``model`` is served but cannot pin, saying where
        pinning works; an unknown model is left to Triton (it answers that)."""
        if model in self.pinnable or model not in self.known:
            return
        where = ", ".join(sorted(self.pinnable)) or "no model of this server"
        raise FrontError(
            f"model {shown(model)} cannot pin a version ({field}); pinning works on: {where}",
            400,
        )
