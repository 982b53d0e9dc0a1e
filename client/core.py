"""The client core (httpx's ``BaseClient`` is the model): settings, request building, discovery,
response decoding and the retry/breaker wiring, written once for every transport and for both
the blocking and the asyncio client.

Each API call is a *flow*: a generator that yields the tritonclient :class:`Call` it needs and
receives its result (or has the call's error thrown in: the retry loop's :class:`ClientError`, a
probe's raw exception, which the flow translates), then returns the answer.
:meth:`BaseClient._drive` runs a flow (once, for both clients); a shell only sends calls
(``_send``): :class:`client.sync.EmbeddingClient` with :func:`client.retry.call_with_retry`,
:class:`client.aio.AsyncEmbeddingClient` with its asyncio twin. The public methods are declared
once, on :class:`BaseClient` (:class:`ClientMethod`): blocking or coroutines as the shell says.

``route`` is the orchestration a call goes through (``ensemble`` | ``bls``); ``pipeline=`` is its
old name, still accepted everywhere (the *pipeline* is what the server serves, picked by ``name``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Generator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    Self,
    TypeVar,
    overload,
)

from tritonforge import tasks
from tritonforge.client.breaker import CircuitBreaker
from tritonforge.client.coroutines import finish
from tritonforge.client.discovery import (
    admin_headers,
    configured_repository,
    fallback,
    fallback_repository,
    grpc_config,
    index_names,
    offline,
    select,
    served,
)
from tritonforge.client.errors import (
    ConnectionFailedError,
    InvalidRequestError,
    ModelNotFoundError,
)
from tritonforge.client.settings import ClientSettings
from tritonforge.client.status import translate
from tritonforge.client.wire import trace_headers
from tritonforge.pipelines import Pipeline, repository_configs

T = TypeVar("T")
P = ParamSpec("P")
C = TypeVar("C", bound="BaseClient")

SETTING_ARGS = (
    "url",
    "protocol",
    "timeout_s",
    "max_attempts",
    "deadline_s",
    "variant",
    "route",
    "batch_size",
    "name",
    "admin_key",
    "repository",
)


@dataclass(frozen=True)
class Call:
    """One tritonclient call: ``method(*args, **kwargs)``, over gRPC with a ``client_timeout``
    bounded by what is left of the retry deadline. ``retried`` False: a probe, sent once without
    the breaker, whose failure is thrown into the flow as raised (the flow translates it)."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    context: str = ""
    retried: bool = True


Flow = Generator[Call, Any, T]


def chosen_route(route: str | None, pipeline: str | None) -> str | None:
    """``route``, or ``pipeline`` (its old name); refusing the two when they disagree."""
    if route is not None and pipeline is not None and route != pipeline:
        raise InvalidRequestError(
            f"route={route!r} and pipeline={pipeline!r} (the old name of route) disagree: "
            "pass route= only"
        )
    return route if route is not None else pipeline


def settings_from(settings: ClientSettings | None, overrides: dict[str, Any]) -> ClientSettings:
    """``settings`` (or the environment's) with the non-None ``overrides`` applied."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if settings is None:
        return ClientSettings(**given)
    merged = {**settings.fields(), **given}
    return ClientSettings(**merged)


def _blocking(
    flow: Callable[Concatenate[C, P], Flow[T]],
) -> Callable[Concatenate[C, P], T]:
    """A blocking client method from a core flow: its ``_send`` blocks, so the drive never
    suspends and :func:`finish` runs it here."""

    @functools.wraps(flow)
    def method(self: C, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return finish(self._drive(flow(self, *args, **kwargs)))

    return _named(method, flow)


def _awaitable(
    flow: Callable[Concatenate[C, P], Flow[T]],
) -> Callable[Concatenate[C, P], Coroutine[Any, Any, T]]:
    """An asyncio client method (a coroutine function) from a core flow."""

    @functools.wraps(flow)
    async def method(self: C, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._drive(flow(self, *args, **kwargs))

    return _named(method, flow)


def _named(method: Callable[..., Any], flow: Callable[..., Any]) -> Any:
    """``method`` named after its flow without the ``_flow`` suffix (``embed_flow``: ``embed``)."""
    method.__name__ = flow.__name__.removesuffix("_flow")
    method.__qualname__ = method.__name__
    return method


class Blocking(Protocol):
    """A blocking shell (:class:`client.sync.EmbeddingClient`), for the type checker."""

    asynchronous: Literal[False]


class Asynchronous(Protocol):
    """An asyncio shell (:class:`client.aio.AsyncEmbeddingClient`), for the type checker."""

    asynchronous: Literal[True]


class ClientMethod(Generic[P, T]):
    """A public client method declared once, on :class:`BaseClient`, from its flow: a blocking
    method on a blocking client, a coroutine function on an asyncio one (the shell's
    ``asynchronous`` says which); so the shells cannot drift apart."""

    def __init__(self, flow: Callable[Concatenate[Any, P], Flow[T]]) -> None:
        self.flow = flow
        self.methods = {False: _blocking(flow), True: _awaitable(flow)}

    @overload
    def __get__(self, obj: None, owner: type) -> Callable[..., Any]: ...
    @overload
    def __get__(self, obj: Blocking, owner: type) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: Asynchronous, owner: type) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, obj: Any, owner: type) -> Any:
        mode = getattr(owner, "asynchronous", None)
        if mode is None:  # on BaseClient itself: the declaration
            return self
        method = self.methods[mode]
        return method if obj is None else method.__get__(obj, owner)


class BaseClient:
    """What the embedding/classification clients share; a subclass sends the calls.

    Arguments override ``settings`` which default to the ``TRITONFORGE_*`` environment (see
    :mod:`client.settings`): ``route`` is the orchestration (ensemble | bls; ``pipeline`` is its
    old name), ``name`` the pipeline (default: the discovered default of the task). Transient
    failures are retried per the settings' retry policy, behind a circuit breaker.
    """

    def __init__(
        self,
        url: str | None = None,
        protocol: str | None = None,
        *,
        timeout_s: float | None = None,
        max_attempts: int | None = None,
        deadline_s: float | None = None,
        variant: str | None = None,
        route: str | None = None,
        batch_size: int | None = None,
        name: str | None = None,
        admin_key: str | None = None,
        repository: str | None = None,
        settings: ClientSettings | None = None,
        breaker: CircuitBreaker | None = None,
        pipeline: str | None = None,
    ) -> None:
        install_task_methods()
        given = dict(locals(), route=chosen_route(route, pipeline))
        self.settings = settings_from(settings, {k: given[k] for k in SETTING_ARGS})
        self.policy = self.settings.retry_policy()
        self.breaker = breaker or self.settings.circuit_breaker()
        self.last_traceparent: str | None = None
        self._pipelines: dict[str, Pipeline] | None = None
        self._module: ModuleType = self.settings.tritonclient_module()
        self._open()

    def sibling(self) -> Self:
        """A new client of the same settings sharing this one's circuit breaker and discovered
        pipelines, with its own transport: for another thread or greenlet (a blocking HTTP
        client belongs to the thread that created it), e.g. an open-loop load generator whose
        concurrent calls share one breaker and no discovery call each."""
        other = type(self)(settings=self.settings, breaker=self.breaker)
        other._pipelines = self._pipelines
        return other

    def _open(self) -> None:
        """Set up the transport (the shell's; the core sends nothing)."""

    def _check_call(self) -> None:
        """Refuse a call the shell cannot make (the blocking client: from another thread)."""

    async def _send(self, call: Call) -> Any:
        """The result of ``call`` (retried unless a probe); raises what it raised, translated."""
        raise NotImplementedError

    def _attempt(self, transport: Any, call: Call) -> Callable[[float], Any]:
        """``call`` on ``transport`` as one attempt ``fn(remaining_s)`` of the retry loop."""
        method = getattr(transport, call.method)
        return lambda remaining_s: method(*call.args, **self._call_kwargs(call, remaining_s))

    async def _drive(self, flow: Flow[T]) -> T:
        """Run ``flow``: send each call it yields, reply with the result or throw the error in."""
        self._check_call()
        result: Any = None
        error: BaseException | None = None
        while True:
            try:
                call = flow.send(result) if error is None else flow.throw(error)
            except StopIteration as done:
                return done.value
            try:
                result, error = await self._send(call), None
            except BaseException as e:
                error = e

    # -- request building -------------------------------------------------------------------------
    @property
    def tritonclient(self) -> ModuleType:
        """The tritonclient module of the protocol (``tritonclient.http`` or ``.grpc``): what
        builds a task's inputs and outputs."""
        return self._module

    def context(self, model: str | None = None) -> str:
        """Where a call goes, for error messages (``model 'x' at http://host:port (...)``)."""
        s = self.settings
        target = f"model {model!r} at " if model else ""
        return f"{target}{s.protocol}://{s.address} (timeout {s.timeout_s:g} s)"

    def _call_kwargs(self, call: Call, remaining_s: float) -> dict[str, Any]:
        """``call``'s keyword arguments, plus gRPC's per-attempt ``client_timeout``."""
        if self.settings.protocol != "grpc":
            return dict(call.kwargs)
        timeout_s = max(0.001, min(self.settings.timeout_s, remaining_s))
        return {**call.kwargs, "client_timeout": timeout_s}

    def trace(self, traceparent: str | None) -> dict[str, str]:
        """The W3C trace headers of one request (``traceparent``, else the active span's, else a
        fresh one); remembered as :attr:`last_traceparent`."""
        headers = trace_headers(traceparent)
        self.last_traceparent = headers["traceparent"]
        return headers

    def infer_call(
        self,
        model: str,
        inputs: list[Any],
        outputs: list[Any],
        parameters: dict[str, Any],
        headers: dict[str, str],
        extra: Mapping[str, Any] | None = None,
    ) -> Call:
        """The :class:`Call` of one inference of ``model`` (a task's flow yields it)."""
        kwargs: dict[str, Any] = {"parameters": parameters} if parameters else {}
        kwargs.update(extra or {}, outputs=outputs, headers=headers)
        return Call("infer", (model, inputs), kwargs, self.context(model))

    # -- discovery --------------------------------------------------------------------------------
    def configs_flow(self) -> Flow[list[dict[str, Any]]]:
        """Every model config the server shows, in Triton's JSON form (the restricted APIs: the
        admin key is sent when set); a model unloaded since the index was read is skipped."""
        headers = admin_headers(self.settings.protocol, self.settings.admin_key)
        grpc = self.settings.protocol == "grpc"
        extra: dict[str, Any] = {"as_json": True} if grpc else {}
        index = yield Call(
            "get_model_repository_index", (), {"headers": headers, **extra}, self.context()
        )
        configs = []
        for model in index_names(index):
            try:
                got = yield Call(
                    "get_model_config", (model,), {"headers": headers}, self.context(model)
                )
            except ModelNotFoundError:
                continue
            configs.append(grpc_config(got) if grpc else dict(got))
        return configs

    def served_configs_flow(self) -> Flow[list[dict[str, Any]]]:
        """The model configs from the sources pipeline discovery reads (:mod:`client.discovery`):
        the configured repository, else the server's (admin key), else ./model_repository where
        the server refused them; a task client that reads configs its pipelines lack uses this."""
        explicit = configured_repository(self.settings.repository)
        if explicit is not None:
            return repository_configs(explicit)
        try:
            return (yield from self.configs_flow())
        except InvalidRequestError as e:
            return repository_configs(fallback_repository(e, self.context()))

    def pipelines_flow(self, refresh: bool = False) -> Flow[dict[str, Pipeline]]:
        """The server's pipelines by name (discovered once, then cached; see
        :mod:`client.discovery` for the sources)."""
        if self._pipelines is None or refresh:
            explicit = configured_repository(self.settings.repository)
            if explicit is not None:
                self._pipelines = offline(explicit)
            else:
                try:
                    configs = yield from self.configs_flow()
                except InvalidRequestError as e:
                    self._pipelines = fallback(e, self.context())
                else:
                    self._pipelines = served(configs, self.context())
        return self._pipelines

    def resolve_flow(
        self,
        task: str,
        name: str | None,
        route: str | None,
        variant: str | None,
        *,
        pipeline: str | None = None,
    ) -> Flow[tuple[Pipeline, str, dict[str, str]]]:
        """(pipeline, model, request parameters) of a ``task`` call; unset arguments come from
        the settings (``pipeline``: the old name of ``route``)."""
        s = self.settings
        pipelines = yield from self.pipelines_flow()
        orchestration = chosen_route(route, pipeline) or s.route
        return select(pipelines, task, name or s.name, orchestration, variant or s.variant)

    # -- API (a task's own methods: install_task_methods) -----------------------------------------
    def _probe_flow(self, method: str, *args: str) -> Flow[bool]:
        try:
            answer = yield Call(method, args, {}, self.context(), retried=False)
        except BaseException as e:
            err = translate(e, self.context())
            if isinstance(err, ConnectionFailedError):
                return False
            raise err from e
        return bool(answer)

    def is_live_flow(self) -> Flow[bool]:
        """Server liveness; False when it cannot be reached."""
        return (yield from self._probe_flow("is_server_live"))

    def is_ready_flow(self) -> Flow[bool]:
        """Server readiness (every model loaded); False when it cannot be reached."""
        return (yield from self._probe_flow("is_server_ready"))

    def is_model_ready_flow(
        self,
        variant: str | None = None,
        route: str | None = None,
        name: str | None = None,
        task: str | None = None,
        *,
        pipeline: str | None = None,
    ) -> Flow[bool]:
        """Readiness of the model serving ``task`` (``pipeline``: the old name of ``route``)."""
        task = task or tasks.default().name
        _, model, _ = yield from self.resolve_flow(task, name, route, variant, pipeline=pipeline)
        return (yield from self._probe_flow("is_model_ready", model))

    def metadata_flow(
        self,
        variant: str | None = None,
        route: str | None = None,
        name: str | None = None,
        task: str | None = None,
        *,
        pipeline: str | None = None,
    ) -> Flow[dict[str, Any]]:
        """The model's metadata (name, versions, inputs, outputs) as a dict."""
        task = task or tasks.default().name
        _, model, _ = yield from self.resolve_flow(task, name, route, variant, pipeline=pipeline)
        extra = {"as_json": True} if self.settings.protocol == "grpc" else {}
        return dict((yield Call("get_model_metadata", (model,), extra, self.context(model))))

    # -- the public API: a shell's blocking methods or coroutines (:class:`ClientMethod`) ----------
    configs = ClientMethod(configs_flow)
    served_configs = ClientMethod(served_configs_flow)
    pipelines = ClientMethod(pipelines_flow)
    resolve = ClientMethod(resolve_flow)
    is_live = ClientMethod(is_live_flow)
    is_ready = ClientMethod(is_ready_flow)
    is_model_ready = ClientMethod(is_model_ready_flow)
    metadata = ClientMethod(metadata_flow)

    if TYPE_CHECKING:  # the tasks' methods (embed, classify, rerank, ...): install_task_methods

        def __getattr__(self, name: str) -> Any: ...


@functools.cache
def install_task_methods() -> None:
    """Give :class:`BaseClient` every registered task's client methods: its ``client`` module's
    ``METHODS`` (method name -> flow ``(client, ...) -> Flow``), each a :class:`ClientMethod`.
    Run by the first client made (not at import: a task's client module may import this one)."""
    for task in tasks.registry().values():
        if not (task.folder / "client.py").is_file():
            continue
        for name, flow in getattr(task.module("client"), "METHODS", {}).items():
            if name in vars(BaseClient):
                raise TypeError(f"task {task.name!r}: client method {name!r} is already taken")
            setattr(BaseClient, name, ClientMethod(flow))
