"""The front's admission of short inferences per model, at the capacity of the queue they go to.

Why: Triton 2.51 (core#466, fixed upstream in 2026) can leave an ensemble request pending forever
when its step refuses it for a full queue (``max_queue_size``): under a 500-connection burst up to
83 ``embed_int8`` requests never got an answer (docs/operations.md, "A connection burst"). So the
front refuses the excess itself, before it reaches Triton: a short inference (v2 ``/infer``, gRPC
``ModelInfer``, the ``/v1`` routes that infer) holds a slot of every bounded queue its model sends
it to (:func:`queue_bounds`: the model's own, or each step's of an ensemble), from the front's send
to Triton's answer; past a queue's bound the front answers 503 / ``UNAVAILABLE`` at once, naming
the model and the bound's source. The bounds come from the served configs
(:class:`~runtime.front.capacity.QueueCapacity`), never from a literal.

The bound is the queue's ``max_queue_size`` (the smallest over the priority levels a request may
land on), not more. The front's count of requests to a step is at least what Triton holds of
them (queued or executing), and Triton refuses an arrival when the level's queue already holds
``max_queue_size`` (``PolicyQueue::Enqueue``: ``Size() >= max_queue_size``). Requests stay queued
until the batcher hands them to a free instance, so "each instance executes one" holds only while
every instance is busy: a burst that arrives at idle instances (between batches, or before the
batcher thread runs) is all queued at once. ``max_queue_size + instance_count`` admitted can then
find the queue full for the last ``instance_count`` arrivals, ``max_queue_size + instance_count x
max_batch_size`` for more; ``max_queue_size`` never lets front traffic alone overflow it (at most
``max_queue_size - 1`` others are queued when one arrives). It costs up to ``instance_count``
requests in flight that Triton could have held, while the queue still feeds every instance.

What it cannot see: requests that reach a step other ways (a BLS model's own calls, clients of
another front) and a request Triton still holds after the front gave up on it (the client left,
or ``request_timeout_s`` ran out); Triton's own refusal stays the last line there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
    """A bounded queue a model's requests go to: ``owner``'s dynamic batcher, which holds
    ``limit`` requests (its ``max_queue_size``, the smallest over its priority levels)."""

    owner: str
    limit: int

    def source(self) -> str:
        return f"{self.owner} max_queue_size {self.limit}"


def _int(value: Any) -> int:
    """A config number (Triton's JSON writes 64-bit integers as strings); 0 when unreadable."""
    try:
        return int(str(value).strip() or 0)
    except ValueError:
        return 0


def _size(policy: Any) -> int:
    return _int(policy.get("max_queue_size", 0)) if isinstance(policy, Mapping) else 0


def queue_limit(config: Mapping[str, Any]) -> int | None:
    """The most requests ``config``'s dynamic batcher queues on any priority level it may put
    a request on: ``default_queue_policy.max_queue_size`` (every level without a policy of its
    own in ``priority_queue_policy`` uses it), the smallest bounded one over the levels; None
    for no dynamic batcher or no bounded level (0 is unbounded)."""
    batching = config.get("dynamic_batching")
    if not isinstance(batching, Mapping):
        return None
    levels = _int(batching.get("priority_levels", 0))
    default = _size(batching.get("default_queue_policy"))
    sizes = [default]
    if levels > 0:
        raw = batching.get("priority_queue_policy") or {}
        per_level = {
            _int(level): _size(policy)
            for level, policy in (raw.items() if isinstance(raw, Mapping) else ())
            if 1 <= _int(level) <= levels
        }
        sizes = list(per_level.values()) + ([default] if len(per_level) < levels else [])
    bounded = [size for size in sizes if size > 0]
    return min(bounded) if bounded else None


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


def queue_bounds(model: str, configs: Mapping[str, Mapping[str, Any]]) -> tuple[QueueBound, ...]:
    """The bounded queues a request to ``model`` goes to, from the served ``configs`` by name:
    its own dynamic batcher's, or for an ensemble each step's (steps of steps followed up to
    :data:`MAX_STEP_DEPTH`). A request holds a slot of each, so its model admits the smallest:
    the first step is where an excess is refused (core#466), and a later step's queue only sees
    what passed the earlier ones. A decoupled model has none here (its streams have their own
    bound, :func:`~runtime.front.guard.stream_capacities`), nor a step whose config is missing."""
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
        limit = None if steps else queue_limit(config)
        if limit is not None:
            out.append(QueueBound(name, limit))

    visit(model, 0)
    return tuple(out)


class QueueAdmission:
    """The slots each bounded queue has left for the front's short inferences
    (:func:`queue_bounds` per model in ``bounds``, set by
    :class:`~runtime.front.capacity.QueueCapacity`), and the refusals per model. A model
    without bounds is let through (as before: Triton's own queue refuses). Used from the front's
    event loop only."""

    def __init__(self) -> None:
        self.bounds: dict[str, tuple[QueueBound, ...]] = {}
        self.held: dict[str, int] = {}  # per queue owner: requests sent and not yet answered
        self.refused: dict[str, int] = {}  # per model asked for

    def enter(self, model: str) -> tuple[QueueBound, ...]:
        """Take a slot of every queue ``model`` goes to (give them back with :meth:`leave`);
        raises :class:`QueueFullError` (503) naming the model and the full queue's bound when one
        is full."""
        bounds = self.bounds.get(model, ())
        for bound in bounds:
            if self.held.get(bound.owner, 0) >= bound.limit:
                self.refused[model] = self.refused.get(model, 0) + 1
                raise QueueFullError(self.full_message(model, bound))
        for bound in bounds:
            self.held[bound.owner] = self.held.get(bound.owner, 0) + 1
        return bounds

    def leave(self, bounds: Iterable[QueueBound]) -> None:
        for bound in bounds:
            self.held[bound.owner] = max(0, self.held.get(bound.owner, 0) - 1)

    @staticmethod
    def full_message(model: str, bound: QueueBound) -> str:
        return (
            f"{model}: overloaded: queue full: the front admits {bound.limit} requests at once "
            f"to {bound.owner} ({bound.source()}; FrontLimits.model_queue_admission); "
            f"retry later"
        )

    def metrics(self, label: Any) -> list[str]:
        """Prometheus lines: each queue's bound and requests held, refusals per model
        (``label`` escapes a label value)."""
        owners = {b.owner: b.limit for bounds in self.bounds.values() for b in bounds}
        return [
            "# HELP tritonforge_front_queue_bound Short inferences the front lets through to a "
            "model's queue at once (its max_queue_size, read from the served config).",
            "# TYPE tritonforge_front_queue_bound gauge",
            *(
                f'tritonforge_front_queue_bound{{queue="{label(o)}"}} {n}'
                for o, n in sorted(owners.items())
            ),
            "# HELP tritonforge_front_queue_held Short inferences in flight to a model's queue.",
            "# TYPE tritonforge_front_queue_held gauge",
            *(
                f'tritonforge_front_queue_held{{queue="{label(o)}"}} {self.held.get(o, 0)}'
                for o in sorted(owners)
            ),
            "# HELP tritonforge_front_queue_refused_total Short inferences the front refused "
            "because a queue of their model was at its bound, per model asked for.",
            "# TYPE tritonforge_front_queue_refused_total counter",
            *(
                f'tritonforge_front_queue_refused_total{{model="{label(m)}"}} '
                f"{self.refused.get(m, 0)}"
                for m in sorted({*self.refused, *(m for m, b in self.bounds.items() if b)})
            ),
        ]
