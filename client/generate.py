"""Streaming text generation against the decoupled ``generate`` model, over gRPC (bidirectional
stream) or HTTP (Triton's ``generate_stream`` extension, server-sent events).

    from tritonforge.client.generate import GenerateClient
    with GenerateClient("localhost:8001", protocol="grpc") as c:
        for chunk in c.generate("What is the capital of France?", max_tokens=16):
            print(chunk, end="", flush=True)
        print(c.last_finish_reason)
    text = c.generate("Hi", stream=False)

    async with AsyncGenerateClient("localhost:8000") as c:
        async for chunk in c.generate("Hi"):
            ...

Closing the iterator early (``break``, an exception, ``close()``) cancels the request on the
server (gRPC: ``stop_stream(cancel_requests=True)``; HTTP: the connection is closed), which
frees its decoding slot within one step. Every failure is a :class:`client.errors.ClientError`.
"""

from __future__ import annotations

import json
import queue
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritonforge.client.breaker import CircuitBreaker
from tritonforge.client.core import settings_from
from tritonforge.client.errors import (
    ClientError,
    DeadlineExceededError,
    InvalidRequestError,
    OverloadedError,
    ResponseError,
    ServerError,
    ServerUnavailableError,
)
from tritonforge.client.retry import breaker_failure
from tritonforge.client.settings import ClientSettings
from tritonforge.client.status import from_status, translate
from tritonforge.generation import FINISH_REASON, TEXT_INPUT, TEXT_OUTPUT
from tritonforge.pipelines import VARIANT_PARAMETER
from tritonforge.stream_errors import says_invalid, says_unavailable

DEFAULT_MODEL = "generate"
STOP = "stop"


@dataclass(frozen=True)
class Chunk:
    text: str
    finish_reason: str | None = None  # set on the final chunk only


def sampling_parameters(**values: Any) -> tuple[dict[str, Any], list[str]]:
    """``(request parameters, stop strings)`` from the keyword arguments that are set. Stop
    strings travel as the ``stop`` input tensor (a list; request parameters are scalars)."""
    stop = values.pop("stop", None) or []
    if isinstance(stop, str):
        stop = [stop]
    return {k: v for k, v in values.items() if v is not None}, list(stop)


def stream_error(message: str, context: str) -> ClientError:
    """The :class:`ClientError` of an in-stream error (SSE ``error`` event, gRPC stream error
    without a status), by its text: the generate model's messages name overload/shutdown and the
    offending field (:func:`client.status.from_status` maps the errors that carry a status)."""
    lowered = message.lower()
    text = f"{context}: {message}"
    if "overloaded" in lowered:
        return OverloadedError(f"{text} (retry later or degrade)")
    if says_unavailable(message):
        return ServerUnavailableError(f"{text} (retry later)")
    if says_invalid(message):
        return InvalidRequestError(text)
    if "cancel" in lowered:
        return ClientError(text)
    return ServerError(f"{text} (see the server log)")


def _grpc_error(exc: Exception, context: str) -> ClientError:
    status = getattr(exc, "status", lambda: None)()
    message = getattr(exc, "message", lambda: str(exc))() or str(exc)
    return translate(exc, context) if status else stream_error(message, context)


def _grpc_chunk(result: Any) -> Chunk:
    text = result.as_numpy(TEXT_OUTPUT)
    reason = result.as_numpy(FINISH_REASON)
    final = result.get_response().parameters.get("triton_final_response")
    decoded = b"".join(text.reshape(-1)).decode("utf-8") if text is not None else ""
    if reason is not None:
        return Chunk(decoded, reason.reshape(-1)[0].decode("utf-8"))
    if final is not None and final.bool_param:
        return Chunk(decoded, "")  # an empty final response (should not happen: guarded)
    return Chunk(decoded)


def _sse_event(line: bytes, context: str) -> Chunk | None:
    """One ``data: {...}`` line of ``generate_stream`` -> a chunk (None for other lines)."""
    if not line.startswith(b"data:"):
        return None
    event = json.loads(line[5:])
    if "error" in event:
        raise stream_error(str(event["error"]), context)
    reason = event.get(FINISH_REASON)
    if isinstance(reason, list):
        reason = reason[0] if reason else None
    text = event.get(TEXT_OUTPUT, "")
    return Chunk("".join(text) if isinstance(text, list) else str(text), reason)


class _Verdict:
    """Reports one stream to the breaker once: the first chunk (or a caller's error) says the
    server answers; a transient failure before that counts against it."""

    def __init__(self, breaker: CircuitBreaker) -> None:
        self.breaker = breaker
        self.probe = breaker.acquire()  # raises CircuitOpenError while the circuit is open
        self.done = False

    def answered(self) -> None:
        if not self.done:
            self.done = True
            self.breaker.record(self.probe, ok=True)

    def failed(self, err: ClientError) -> None:
        if not self.done:
            self.done = True
            self.breaker.record(self.probe, ok=not breaker_failure(err))

    def close(self) -> None:
        if not self.done:
            self.done = True
            self.breaker.release(self.probe)


class GenerationBase:
    """What the blocking and the asyncio generation clients share: settings, the decoder model
    (discovered when a ``variant`` is pinned), the breaker and the request's parameters.

    Streams are not retried (a half-streamed answer cannot be replayed); the circuit breaker
    (:mod:`client.breaker`) fails them fast while the server keeps failing.
    """

    def __init__(
        self,
        url: str | None = None,
        protocol: str | None = None,
        model: str = DEFAULT_MODEL,
        timeout_s: float | None = None,
        variant: str | None = None,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        """``variant`` (fp32, int8, ...) pins the decoder: the model serving it in ``model``'s
        group is discovered (:func:`generator_model`) and every request carries the ``variant``
        parameter, which the model checks (a mismatch is refused, never answered silently)."""
        given = {"url": url, "protocol": protocol or None, "timeout_s": timeout_s or None}
        self.settings = settings_from(None, given)
        self.variant = variant
        self.model = generator_model(self.settings, model, variant) if variant else model
        self.breaker = breaker or self.settings.circuit_breaker()
        self.last_finish_reason: str | None = None
        self.context = f"{self.settings.protocol}://{self.settings.address} model {self.model!r}"

    def _request(self, sampling: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """(request parameters, stop strings) of one stream: ``sampling`` and the variant."""
        return sampling_parameters(**{VARIANT_PARAMETER: self.variant, **sampling})

    def _finish(self, chunk: Chunk) -> Chunk:
        if chunk.finish_reason is not None:
            self.last_finish_reason = chunk.finish_reason
        return chunk


class GenerateClient(GenerationBase):
    """Blocking client; :meth:`stream` yields :class:`Chunk`, :meth:`generate` text."""

    def __enter__(self) -> GenerateClient:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def generate(self, prompt: str, stream: bool = True, **sampling: Any) -> Iterator[str] | str:
        """Text chunks as they arrive (``stream=True``) or the whole text. ``sampling``:
        max_tokens, temperature, top_p, top_k, seed, stop, chat_template."""
        chunks = (c.text for c in self.stream(prompt, **sampling))
        return chunks if stream else "".join(chunks)

    def stream(self, prompt: str, **sampling: Any) -> Iterator[Chunk]:
        params, stop = self._request(sampling)
        source = self._grpc if self.settings.protocol == "grpc" else self._http
        verdict = _Verdict(self.breaker)
        try:
            for chunk in source(prompt, params, stop):
                verdict.answered()
                yield chunk
        except ClientError as e:
            verdict.failed(e)
            raise
        finally:
            verdict.close()

    def _grpc(self, prompt: str, params: dict[str, Any], stop: list[str]) -> Iterator[Chunk]:
        import tritonclient.grpc as grpcclient

        responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client = grpcclient.InferenceServerClient(self.settings.address)
        done = False
        try:
            client.start_stream(callback=lambda result, error: responses.put((result, error)))
            client.async_stream_infer(
                self.model,
                grpc_inputs(grpcclient.InferInput, prompt, stop),
                parameters=params,
                enable_empty_final_response=True,
            )
            while not done:
                try:
                    result, error = responses.get(timeout=self.settings.timeout_s)
                except queue.Empty as e:
                    raise DeadlineExceededError(
                        f"{self.context}: no response within {self.settings.timeout_s} s"
                    ) from e
                if error is not None:
                    done = True
                    raise _grpc_error(error, self.context)
                chunk = self._finish(_grpc_chunk(result))
                done = chunk.finish_reason is not None
                yield chunk
        except ClientError:
            raise
        except Exception as e:
            raise translate(e, self.context) from e
        finally:
            # Early exit: cancel the request so the server frees its slot.
            stream = getattr(client, "_stream", None)
            client.stop_stream(cancel_requests=not done)
            if not done and stream is not None:
                # tritonclient ends the request iterator only without cancel_requests: its
                # feeding thread would block forever (one thread leaked per cancelled stream)
                stream._request_queue.put(None)
            client.close()

    def _http(self, prompt: str, params: dict[str, Any], stop: list[str]) -> Iterator[Chunk]:
        import requests

        url = f"http://{self.settings.address}/v2/models/{self.model}/generate_stream"
        body = http_body(prompt, params, stop)
        try:
            response = requests.post(url, json=body, stream=True, timeout=self.settings.timeout_s)
        except requests.Timeout as e:
            raise DeadlineExceededError(f"{self.context}: {e}") from e
        except requests.RequestException as e:
            raise translate(OSError(str(e)), self.context) from e
        with response:
            if response.status_code != 200:
                raise _http_status(response.status_code, response.text, self.context)
            try:
                for line in response.iter_lines():
                    chunk = _sse_event(line, self.context)
                    if chunk is not None:
                        yield self._finish(chunk)
                        if chunk.finish_reason is not None:
                            return
            except requests.RequestException as e:
                raise translate(OSError(str(e)), self.context) from e
        raise ResponseError(f"{self.context}: the stream ended without a final response")


def _served_configs(settings: ClientSettings) -> list[dict[str, Any]]:
    """Every model config the server shows (the client core's discovery, tried once)."""
    from tritonforge.client.sync import EmbeddingClient

    with EmbeddingClient(settings=settings, max_attempts=1) as client:
        return client.configs()


def generator_model(settings: ClientSettings, group: str, variant: str) -> str:
    """The model serving ``variant`` in the generation group ``group`` (``tritonforge.generator``),
    from the repository on disk when one is configured, else the server's configs (falling back to
    ``./model_repository`` when the server refuses them). :class:`InvalidRequestError` names
    ``variant`` and the choices."""
    from tritonforge.client.discovery import (
        DEFAULT_REPOSITORY,
        configured_repository,
        refused,
    )
    from tritonforge.pipelines import discover_generators, generators_from_repository

    explicit = configured_repository(settings.repository)
    if explicit is not None:
        found = generators_from_repository(explicit)
    else:
        try:
            found = discover_generators(_served_configs(settings))
        except Exception as e:
            error = translate(e, f"{settings.address}: discovery")
            if not (refused(error) and DEFAULT_REPOSITORY.is_dir()):
                raise error from e
            found = generators_from_repository(DEFAULT_REPOSITORY)
    if group not in found:
        raise InvalidRequestError(
            f"model: no generation models {group!r} (groups: {sorted(found)}); cannot pin "
            f"variant={variant!r}"
        )
    try:
        return found[group].model(variant)
    except KeyError as e:
        raise InvalidRequestError(f"variant: {e.args[0]}") from e


def grpc_inputs(infer_input: Any, prompt: str, stop: list[str]) -> list[Any]:
    """``text_input`` (and ``stop`` when given) as gRPC input tensors."""
    out = []
    for name, values in ((TEXT_INPUT, [prompt]), (STOP, stop)):
        if values:
            tensor = infer_input(name, [len(values)], "BYTES")
            tensor.set_data_from_numpy(np.array([v.encode("utf-8") for v in values], np.object_))
            out.append(tensor)
    return out


def http_body(prompt: str, params: dict[str, Any], stop: list[str]) -> dict[str, Any]:
    """The generate-extension body: inputs as top-level keys, the rest as parameters."""
    body: dict[str, Any] = {TEXT_INPUT: prompt, "parameters": params}
    if stop:
        body[STOP] = stop
    return body


def _http_status(code: int, body: str, context: str) -> ClientError:
    try:
        message = str(json.loads(body).get("error", body))
    except ValueError:
        message = body
    return from_status(str(code), message, context)


class AsyncGenerateClient(GenerationBase):
    """asyncio client: ``async for chunk in c.generate(prompt)`` (text chunks); arguments as
    :class:`GenerateClient` (a pinned variant's model is discovered once, when it is made)."""

    async def __aenter__(self) -> AsyncGenerateClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        pass

    async def generate(self, prompt: str, **sampling: Any) -> AsyncIterator[str]:
        async for chunk in self.stream(prompt, **sampling):
            yield chunk.text

    async def stream(self, prompt: str, **sampling: Any) -> AsyncIterator[Chunk]:
        params, stop = self._request(sampling)
        source = self._grpc if self.settings.protocol == "grpc" else self._http
        verdict = _Verdict(self.breaker)
        try:
            async for chunk in source(prompt, params, stop):
                verdict.answered()
                yield self._finish(chunk)
                if chunk.finish_reason is not None:
                    return
        except ClientError as e:
            verdict.failed(e)
            raise
        finally:
            verdict.close()

    async def _grpc(
        self, prompt: str, params: dict[str, Any], stop: list[str]
    ) -> AsyncIterator[Chunk]:
        import tritonclient.grpc.aio as grpcaio
        from tritonclient.grpc import InferInput

        async with grpcaio.InferenceServerClient(self.settings.address) as client:

            async def requests() -> AsyncIterator[dict[str, Any]]:
                yield {
                    "model_name": self.model,
                    "inputs": grpc_inputs(InferInput, prompt, stop),
                    "parameters": params,
                    "enable_empty_final_response": True,
                }

            stream = client.stream_infer(requests(), stream_timeout=self.settings.timeout_s)
            try:
                async for result, error in stream:
                    if error is not None:
                        raise _grpc_error(error, self.context)
                    yield _grpc_chunk(result)
            except ClientError:
                raise
            except Exception as e:
                raise translate(e, self.context) from e
            finally:
                stream.cancel()  # ends the call (cancels the request if it is still running)

    async def _http(
        self, prompt: str, params: dict[str, Any], stop: list[str]
    ) -> AsyncIterator[Chunk]:
        import aiohttp

        url = f"http://{self.settings.address}/v2/models/{self.model}/generate_stream"
        timeout = aiohttp.ClientTimeout(total=None, sock_read=self.settings.timeout_s)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(url, json={TEXT_INPUT: prompt, "parameters": params}) as response,
            ):
                if response.status != 200:
                    raise _http_status(response.status, await response.text(), self.context)
                async for line in response.content:
                    chunk = _sse_event(line.strip(), self.context)
                    if chunk is not None:
                        yield chunk
        except ClientError:
            raise
        except TimeoutError as e:
            raise DeadlineExceededError(f"{self.context}: timed out") from e
        except aiohttp.ClientError as e:
            raise translate(e, self.context) from e
