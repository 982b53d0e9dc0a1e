"""The front's admission of ensemble inferences, at the capacity of their steps' queues.

Why: Triton 2.51 (core#466, fixed upstream in 2026) can leave an ensemble request pending forever
when its step refuses it for a full queue (``max_queue_size``): under a 500-connection burst up to
83 ``embed_int8`` requests never got an answer (docs/operations.md, "A connection burst"). So the
front refuses the excess itself, before it reaches Triton: a short inference (v2 ``/infer``, gRPC
``ModelInfer``, the ``/v1`` routes that infer) of an ensemble holds a slot of each bounded queue
of its steps (:func:`queue_bounds`), from the front's send to Triton's answer; past a bound the
front answers 503 / ``UNAVAILABLE`` at once, naming the model and the bound's source. The bounds
come from the served configs (:class:`~runtime.front.capacity.QueueCapacity`), never a literal.

Which queue: a step request lands on its model's default priority level (Triton clamps the
ensemble request's priority to the ensemble's own, 0, and a step maps 0 to its
``default_priority_level``), so that level's ``max_queue_size`` bounds it. A request sent to a
plain model with a bounded queue holds a slot of the same queue (it may be a step of an ensemble
the front admits) but is never refused by the front: Triton answers its own refusal of a plain
model, and the model's priority levels keep their own queues (a top-priority request, the
liveness canary, still gets in while bulk traffic fills the default level; a BLS still sees the
backlog it degrades on).

The bound is the queue's ``max_queue_size``, not more. The front's count of requests to a step
is at least what Triton holds of them (queued or executing), and Triton refuses an arrival when
the level's queue already holds ``max_queue_size`` (``PolicyQueue::Enqueue``: ``Size() >=
max_queue_size``). Requests stay queued until the batcher hands them to a free instance, so "each
instance executes one" holds only while every instance is busy: a burst that arrives at idle
instances (between batches, or before the batcher thread runs) is all queued at once.
``max_queue_size + instance_count`` admitted can then find the queue full for the last
``instance_count`` arrivals, ``max_queue_size + instance_count x max_batch_size`` for more;
``max_queue_size`` never lets front traffic alone overflow it (at most ``max_queue_size - 1``
others are queued when one arrives). It costs up to ``instance_count`` requests in flight that
Triton could have held, while the queue still feeds every instance.

What it cannot see: requests that reach a step other ways (a BLS model's own calls, clients of
another front) and a request Triton still holds after the front gave up on it (the client left,
or ``request_timeout_s`` ran out); Triton's own refusal stays the last line there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tritonforge.runtime.errors import FrontError

MAX_STEP_DEPTH = 8  # ensembles of ensembles: deeper nesting is not followed


class QueueFullError(FrontError):
    """A queue of the model is at its bound (503): the message names the model, the queue and
    the bound's source; retry later."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 503)


@dataclass(frozen=True)
class QueueBound:
    """A bounded queue requests go to: ``owner``'s dynamic batcher queue on priority ``level``
    (0: the model has no levels), which holds ``limit`` requests (its ``max_queue_size``)."""

    owner: str
    level: int
    limit: int

    def source(self) -> str:
        at = f" at priority level {self.level}" if self.level else ""
        return f"{self.owner} max_queue_size {self.limit}{at}"


@dataclass(frozen=True)
class ModelQueues:
    """The bounded queues a model's requests go to, and whether the front refuses past them
    (an ensemble: ``refuse``) or only counts its requests in them (a plain model)."""

    bounds: tuple[QueueBound, ...] = ()
    refuse: bool = False


def _int(value: Any) -> int:
    """A config number (Triton's JSON writes 64-bit integers as strings); 0 when unreadable."""
    try:
        return int(str(value).strip() or 0)
    except ValueError:
        return 0


def _size(policy: Any) -> int:
    return _int(policy.get("max_queue_size", 0)) if isinstance(policy, Mapping) else 0


def default_queue(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(level, max_queue_size)`` of the queue ``config``'s dynamic batcher puts a request on
    when it names no priority (every step request of an ensemble): its
    ``default_priority_level`` (0 without ``priority_levels``), bounded by that level's policy in
    ``priority_queue_policy`` or else ``default_queue_policy``. None for no dynamic batcher or an
    unbounded queue (``max_queue_size`` 0)."""
    batching = config.get("dynamic_batching")
    if not isinstance(batching, Mapping):
        return None
    level = 0
    policy = batching.get("default_queue_policy")
    if _int(batching.get("priority_levels", 0)) > 0:
        level = _int(batching.get("default_priority_level", 0))
        per_level = batching.get("priority_queue_policy") or {}
        if isinstance(per_level, Mapping):
            own = [p for k, p in per_level.items() if _int(k) == level]
            policy = own[0] if own else policy
    size = _size(policy)
    return (level, size) if size > 0 else None


def ensemble_steps(config: Mapping[str, Any]) -> list[str]:
    """The models an ensemble's steps call (``ensemble_scheduling.step[].model_name``), in order,
    each once; [] for a model that is no ensemble."""
    scheduling = config.get("ensemble_scheduling")
    steps = scheduling.get("step") if isinstance(scheduling, Mapping) else None
    names: list[str] = []
    for step in steps if isinstance(steps, list) else ():
        name = str(step.get("model_name", "")) if isinstance(step, Mapping) else ""
        if name and name not in names:
            names.append(name)
    return names


def _decoupled(config: Mapping[str, Any]) -> bool:
    policy = config.get("model_transaction_policy")
    return isinstance(policy, Mapping) and bool(policy.get("decoupled"))


def queue_bounds(model: str, configs: Mapping[str, Mapping[str, Any]]) -> ModelQueues:
    """The bounded queues a request to ``model`` goes to, from the served ``configs`` by name:
    for an ensemble each step's (:func:`default_queue`; steps of steps followed up to
    :data:`MAX_STEP_DEPTH`), refused past them; for a plain model its own, counted only. A
    request holds a slot of each, so an ensemble admits the smallest: the first step is where
    an excess is refused (core#466), and a later step's queue sees only what passed the earlier
    ones. A decoupled model has none here (its streams have their own bound,
    :func:`~runtime.front.guard.stream_capacities`), nor a step whose config is missing."""
    out: list[QueueBound] = []
    seen: set[str] = set()

    def visit(name: str, depth: int) -> None:
        config = configs.get(name)
        if config is None or name in seen or depth > MAX_STEP_DEPTH or _decoupled(config):
            return
        seen.add(name)
        steps = ensemble_steps(config)
        for step in steps:
            visit(step, depth + 1)
        queue = None if steps else default_queue(config)
        if queue is not None:
            out.append(QueueBound(name, *queue))

    visit(model, 0)
    config = configs.get(model)
    return ModelQueues(tuple(out), bool(config and ensemble_steps(config)))


class QueueAdmission:
    """The slots each bounded queue has left for the front's short inferences
    (:func:`queue_bounds` per model in ``bounds``, set by
    :class:`~runtime.front.capacity.QueueCapacity`), and the refusals per model. A model
    without bounds is let through (as before: Triton's own queue refuses). Used from the front's
    event loop only."""

    def __init__(self) -> None:
        self.bounds: dict[str, ModelQueues] = {}
        # per queue (owner, level): requests sent and not yet answered
        self.held: dict[tuple[str, int], int] = {}
        self.refused: dict[str, int] = {}  # per model asked for

    def enter(self, model: str) -> tuple[QueueBound, ...]:
        """Take a slot of every queue ``model`` goes to (give them back with :meth:`leave`);
        for an ensemble raises :class:`QueueFullError` (503) naming the model and the full
        queue's bound when one is full."""
        queues = self.bounds.get(model, ModelQueues())
        for bound in queues.bounds if queues.refuse else ():
            if self.held.get((bound.owner, bound.level), 0) >= bound.limit:
                self.refused[model] = self.refused.get(model, 0) + 1
                raise QueueFullError(self.full_message(model, bound))
        for bound in queues.bounds:
            key = (bound.owner, bound.level)
            self.held[key] = self.held.get(key, 0) + 1
        return queues.bounds

    def leave(self, bounds: Iterable[QueueBound]) -> None:
        for bound in bounds:
            key = (bound.owner, bound.level)
            self.held[key] = max(0, self.held.get(key, 0) - 1)

    @staticmethod
    def full_message(model: str, bound: QueueBound) -> str:
        return (
            f"{model}: overloaded: queue full: the front admits {bound.limit} requests at once "
            f"to {bound.owner} ({bound.source()}; FrontLimits.model_queue_admission); "
            f"retry later"
        )

    def metrics(self, label: Callable[[str], str]) -> list[str]:
        """Prometheus lines: each queue's bound and requests held, the front's refusals per
        ensemble (``label`` escapes a label value)."""
        queues = sorted({b for q in self.bounds.values() for b in q.bounds}, key=str)
        ensembles = {m for m, q in self.bounds.items() if q.refuse and q.bounds}

        def labels(b: QueueBound) -> str:
            return f'queue="{label(b.owner)}",level="{b.level}"'

        return [
            "# HELP tritonforge_front_queue_bound Inferences the front lets through to an "
            "ensemble step's queue at once (its max_queue_size, from the served config).",
            "# TYPE tritonforge_front_queue_bound gauge",
            *(f"tritonforge_front_queue_bound{{{labels(b)}}} {b.limit}" for b in queues),
            "# HELP tritonforge_front_queue_held Inferences in flight through the front to a "
            "queue.",
            "# TYPE tritonforge_front_queue_held gauge",
            *(
                f"tritonforge_front_queue_held{{{labels(b)}}} "
                f"{self.held.get((b.owner, b.level), 0)}"
                for b in queues
            ),
            "# HELP tritonforge_front_queue_refused_total Inferences the front refused because "
            "a step queue of the ensemble was at its bound, per ensemble.",
            "# TYPE tritonforge_front_queue_refused_total counter",
            *(
                f'tritonforge_front_queue_refused_total{{model="{label(m)}"}} '
                f"{self.refused.get(m, 0)}"
                for m in sorted({*self.refused, *ensembles})
            ),
        ]
