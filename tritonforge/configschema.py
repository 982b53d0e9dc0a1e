"""Triton's model config as typed, frozen dataclasses, and the one renderer of ``config.pbtxt``.

Every config.pbtxt tritonforge writes (encoders and their ``configs/gpu.pbtxt``, tokenizers,
postprocess, ensembles, BLS, the decoupled ``generate`` model) is a :class:`TritonConfig` built
by the export and rendered by :func:`render_pbtxt` (or :func:`render_compact` for the hand-laid
``generate`` config). Both go through Triton's ``model_config_pb2``: a config that does not fit
the schema fails at export time with the field named. The one parser reads text with the same
schema (:func:`tritonforge.modelconfig.pbtxt_to_dict`) into Triton's JSON form, from which
:func:`from_json` builds the typed config and ``ModelConfig.from_json`` the serving view models
read (Triton hands them that JSON form); :class:`TensorSpec` is the tensor type of both, so what
is written and what is read share one definition.

Why here, in the core: :class:`QueueLimits` (the queue knobs, declared once) and the dataclasses
are plain data used by the export specs; the core is imported inside Triton's Python stub, whose
environment may lack ``tritonclient``, so ``model_config_pb2`` and protobuf are imported lazily,
inside the renderers only. Module-level imports stay stdlib (+ the core).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tritonforge.errors import ModelConfigError
from tritonforge.modelconfig import ModelConfig, TensorSpec, pbtxt_to_dict

Params = tuple[tuple[str, str], ...]


def params(values: Mapping[str, object]) -> Params:
    """``parameters`` entries (key, string value) in the mapping's order."""
    return tuple((str(k), str(v)) for k, v in values.items())


@dataclass(frozen=True, kw_only=True)
class QueueLimits:
    """A model's queue knobs as a spec declares them (encoders, tokenizer, BLS).

    ``max_queue_delay_us``: how long the batcher waits for more requests. Overload protection:
    at most ``max_queue_size`` requests wait (0 = unbounded); the excess is refused at once
    (UNAVAILABLE) and none waits longer than ``queue_timeout_us``.
    """

    max_queue_delay_us: int = 0
    max_queue_size: int = 64
    queue_timeout_us: int = 10_000_000

    def queue_policy(self) -> QueuePolicy | None:
        if self.max_queue_size <= 0:
            return None
        return QueuePolicy(self.max_queue_size, self.queue_timeout_us)


@dataclass(frozen=True)
class QueuePolicy:
    """``dynamic_batching.default_queue_policy``: a bounded queue refusing the excess."""

    max_queue_size: int
    default_timeout_us: int
    timeout_action: str = "REJECT"
    allow_timeout_override: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "max_queue_size": self.max_queue_size,
            "timeout_action": self.timeout_action,
            "default_timeout_microseconds": self.default_timeout_us,
            "allow_timeout_override": self.allow_timeout_override,
        }


@dataclass(frozen=True)
class DynamicBatching:
    """``dynamic_batching``. ``priority_levels`` > 0: level 1 is served first; requests without
    a priority get the last level (``default_priority_level``)."""

    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    priority_levels: int = 0
    queue_policy: QueuePolicy | None = None

    @classmethod
    def of(
        cls, queue: QueueLimits, priority_levels: int = 0, delay_us: int | None = None
    ) -> DynamicBatching:
        """The batching of a model whose queue is ``queue`` (``delay_us`` overrides its delay)."""
        delay = queue.max_queue_delay_us if delay_us is None else delay_us
        return cls(delay, (), priority_levels, queue.queue_policy())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"max_queue_delay_microseconds": self.max_queue_delay_us}
        if self.priority_levels > 0:
            out["priority_levels"] = self.priority_levels
            out["default_priority_level"] = self.priority_levels
        if self.preferred_batch_sizes:
            out["preferred_batch_size"] = list(self.preferred_batch_sizes)
        if self.queue_policy is not None:
            out["default_queue_policy"] = self.queue_policy.to_json()
        return out


@dataclass(frozen=True)
class InstanceGroup:
    count: int = 1
    kind: str = "KIND_CPU"

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "kind": self.kind}


@dataclass(frozen=True)
class VersionPolicy:
    """``version_policy``: the latest version only, or exactly ``versions`` side by side."""

    versions: tuple[int, ...] = ()

    @classmethod
    def serving(cls, versions: tuple[int, ...]) -> VersionPolicy:
        """Version 1 alone is served as "latest 1"; anything else as these specific versions."""
        return cls(() if versions == (1,) else versions)

    def to_json(self) -> dict[str, Any]:
        if not self.versions:
            return {"latest": {"num_versions": 1}}
        return {"specific": {"versions": list(self.versions)}}


@dataclass(frozen=True)
class EnsembleStep:
    """One step of ``ensemble_scheduling``; maps are (model tensor, ensemble tensor) pairs."""

    model_name: str
    input_map: Params
    output_map: Params
    model_version: int = -1

    def to_json(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "model_version": self.model_version,
            "input_map": dict(self.input_map),
            "output_map": dict(self.output_map),
        }


@dataclass(frozen=True)
class WarmupInput:
    """One input of a warmup sample, read from a raw file in the model's ``warmup/`` folder."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    input_data_file: str

    def to_json(self) -> dict[str, Any]:
        return {
            "data_type": self.data_type,
            "dims": list(self.dims),
            "input_data_file": self.input_data_file,
        }


@dataclass(frozen=True)
class Warmup:
    name: str
    inputs: tuple[WarmupInput, ...]
    batch_size: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "batch_size": self.batch_size,
            "inputs": {i.name: i.to_json() for i in self.inputs},
        }


@dataclass(frozen=True)
class Accelerator:
    """A GPU execution accelerator (e.g. TensorRT inside ONNX Runtime) and its parameters."""

    name: str
    parameters: Params = ()


@dataclass(frozen=True)
class Optimization:
    """``optimization``: GPU execution accelerators and the CUDA graphs switch."""

    gpu_accelerators: tuple[Accelerator, ...] = ()
    cuda_graphs: bool = False

    def to_json(self) -> dict[str, Any]:
        accelerators = [
            {"name": a.name, "parameters": dict(a.parameters)} for a in self.gpu_accelerators
        ]
        return {
            "execution_accelerators": {"gpu_execution_accelerator": accelerators},
            "cuda": {"graphs": self.cuda_graphs},
        }


def _tensor_json(t: TensorSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"name": t.name, "data_type": t.data_type, "dims": list(t.dims)}
    if t.optional:
        out["optional"] = True
    if t.label_filename:
        out["label_filename"] = t.label_filename
    return out


@dataclass(frozen=True)
class TritonConfig:
    """One model's whole config.pbtxt (the parts tritonforge uses). ``backend`` or ``platform``
    (``"ensemble"`` with ``ensemble_steps``); ``decoupled`` sets the transaction policy."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    backend: str = ""
    platform: str = ""
    default_model_filename: str = ""
    version_policy: VersionPolicy | None = None
    instance_groups: tuple[InstanceGroup, ...] = ()
    parameters: Params = ()
    dynamic_batching: DynamicBatching | None = None
    ensemble_steps: tuple[EnsembleStep, ...] = ()
    decoupled: bool = False
    response_cache: bool = False
    optimization: Optimization | None = None
    warmup: tuple[Warmup, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Triton's JSON form (what ``ModelConfig.from_json`` and ``render_pbtxt`` read)."""
        out: dict[str, Any] = {"name": self.name}
        out.update({k: v for k, v in (("backend", self.backend), ("platform", self.platform)) if v})
        out["max_batch_size"] = self.max_batch_size
        if self.decoupled:
            out["model_transaction_policy"] = {"decoupled": True}
        if self.default_model_filename:
            out["default_model_filename"] = self.default_model_filename
        out["input"] = [_tensor_json(t) for t in self.inputs]
        out["output"] = [_tensor_json(t) for t in self.outputs]
        if self.version_policy is not None:
            out["version_policy"] = self.version_policy.to_json()
        if self.instance_groups:
            out["instance_group"] = [g.to_json() for g in self.instance_groups]
        if self.ensemble_steps:
            out["ensemble_scheduling"] = {"step": [s.to_json() for s in self.ensemble_steps]}
        if self.parameters:
            out["parameters"] = {k: {"string_value": v} for k, v in self.parameters}
        out.update(self._extras())
        return out

    def _extras(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.response_cache:
            out["response_cache"] = {"enable": True}
        if self.dynamic_batching is not None:
            out["dynamic_batching"] = self.dynamic_batching.to_json()
        if self.optimization is not None:
            out["optimization"] = self.optimization.to_json()
        if self.warmup:
            out["model_warmup"] = [w.to_json() for w in self.warmup]
        return out


def _pairs(obj: Mapping[str, Any] | None) -> Params:
    return tuple((str(k), str(v)) for k, v in (obj or {}).items())


def _batching_from_json(obj: Mapping[str, Any]) -> DynamicBatching:
    policy = obj.get("default_queue_policy")
    return DynamicBatching(
        int(obj.get("max_queue_delay_microseconds", 0)),
        tuple(int(b) for b in obj.get("preferred_batch_size", [])),
        int(obj.get("priority_levels", 0)),
        None
        if policy is None
        else QueuePolicy(
            int(policy.get("max_queue_size", 0)),
            int(policy.get("default_timeout_microseconds", 0)),
            str(policy.get("timeout_action", "REJECT")),
            bool(policy.get("allow_timeout_override", False)),
        ),
    )


def _optimization_from_json(obj: Mapping[str, Any]) -> Optimization:
    accelerators = (obj.get("execution_accelerators") or {}).get("gpu_execution_accelerator", [])
    return Optimization(
        tuple(Accelerator(str(a["name"]), _pairs(a.get("parameters"))) for a in accelerators),
        bool((obj.get("cuda") or {}).get("graphs", False)),
    )


def _warmup_from_json(obj: Mapping[str, Any]) -> Warmup:
    inputs = tuple(
        WarmupInput(
            str(k),
            str(v.get("data_type", "")),
            tuple(int(d) for d in v.get("dims", [])),
            str(v.get("input_data_file", "")),
        )
        for k, v in (obj.get("inputs") or {}).items()
    )
    return Warmup(str(obj.get("name", "")), inputs, int(obj.get("batch_size", 0)))


def _step_from_json(obj: Mapping[str, Any]) -> EnsembleStep:
    return EnsembleStep(
        str(obj["model_name"]),
        _pairs(obj.get("input_map")),
        _pairs(obj.get("output_map")),
        int(obj.get("model_version", -1)),
    )


def _version_policy_from_json(obj: Mapping[str, Any] | None) -> VersionPolicy | None:
    if obj is None:
        return None
    return VersionPolicy(tuple(int(v) for v in (obj.get("specific") or {}).get("versions", [])))


def from_json(obj: Mapping[str, Any]) -> TritonConfig:
    """The typed config of Triton's JSON form (``pbtxt_to_dict`` of a config.pbtxt, or the
    ``args["model_config"]`` a Python model gets); parts tritonforge does not use are dropped."""
    batching, optimization = obj.get("dynamic_batching"), obj.get("optimization")
    return TritonConfig(
        name=str(obj.get("name", "")),
        max_batch_size=int(obj.get("max_batch_size", 0)),
        inputs=tuple(TensorSpec.from_json(t) for t in obj.get("input", [])),
        outputs=tuple(TensorSpec.from_json(t) for t in obj.get("output", [])),
        backend=str(obj.get("backend", "")),
        platform=str(obj.get("platform", "")),
        default_model_filename=str(obj.get("default_model_filename", "")),
        version_policy=_version_policy_from_json(obj.get("version_policy")),
        instance_groups=tuple(
            InstanceGroup(int(g.get("count", 1)), str(g.get("kind", "KIND_AUTO")))
            for g in obj.get("instance_group", [])
        ),
        parameters=tuple(ModelConfig.from_json(obj).parameters.items()),
        dynamic_batching=None if batching is None else _batching_from_json(batching),
        ensemble_steps=tuple(
            _step_from_json(s) for s in (obj.get("ensemble_scheduling") or {}).get("step", [])
        ),
        decoupled=bool((obj.get("model_transaction_policy") or {}).get("decoupled", False)),
        response_cache=bool((obj.get("response_cache") or {}).get("enable", False)),
        optimization=None if optimization is None else _optimization_from_json(optimization),
        warmup=tuple(_warmup_from_json(w) for w in obj.get("model_warmup", [])),
    )


def parse_pbtxt(text: str) -> TritonConfig:
    """The typed config of config.pbtxt text, parsed with Triton's schema (needs tritonclient)."""
    return from_json(pbtxt_to_dict(text))


def to_message(config: TritonConfig | Mapping[str, Any]) -> Any:
    """``model_config_pb2.ModelConfig`` of a config (typed or Triton's JSON form); a field that
    does not fit Triton's schema raises :class:`ModelConfigError` naming it."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2

    data = config.to_json() if isinstance(config, TritonConfig) else dict(config)
    try:
        return json_format.ParseDict(data, model_config_pb2.ModelConfig())
    except json_format.ParseError as e:
        name = data.get("name", "?")
        raise ModelConfigError(
            f"model {name!r}: the config does not fit Triton's model_config schema ({e}); "
            "fix the spec or the config builder"
        ) from e


def render_pbtxt(config: TritonConfig | Mapping[str, Any]) -> str:
    """config.pbtxt text of ``config``, printed by protobuf from the validated message."""
    from google.protobuf import text_format

    return str(text_format.MessageToString(to_message(config)))


def _quote(value: str) -> str:
    from google.protobuf import text_encoding

    return '"' + str(text_encoding.CEscape(value, as_utf8=True)) + '"'


def _compact_tensor(t: TensorSpec) -> str:
    optional = " optional: true" if t.optional else ""
    dims = " ".join(str(d) for d in t.dims)
    return f"  {{ name: {_quote(t.name)} data_type: {t.data_type} dims: [ {dims} ]{optional} }}"


def _compact_lines(config: TritonConfig) -> Iterable[str]:
    yield f"name: {_quote(config.name)}"
    yield f"backend: {_quote(config.backend)}"
    yield f"max_batch_size: {config.max_batch_size}"
    if config.decoupled:
        yield "model_transaction_policy { decoupled: true }"
    for key, tensors in (("input", config.inputs), ("output", config.outputs)):
        yield f"{key} ["
        yield ",\n".join(_compact_tensor(t) for t in tensors)
        yield "]"
    groups = ", ".join(f"{{ count: {g.count} kind: {g.kind} }}" for g in config.instance_groups)
    yield f"instance_group [ {groups} ]"
    for k, v in config.parameters:
        yield f"parameters {{ key: {_quote(k)} value: {{ string_value: {_quote(v)} }} }}"


def render_compact(config: TritonConfig, comments: Iterable[str] = ()) -> str:
    """config.pbtxt of a backend model in the compact, hand-readable layout (one line per tensor
    and parameter, parameters in declaration order), after ``comments`` (``# `` lines).

    The text is parsed back with ``model_config_pb2`` and must equal :func:`to_message` of
    ``config``: a field the layout does not print raises :class:`ModelConfigError`.
    """
    from google.protobuf import text_format

    text = "\n".join([*(f"# {c}" for c in comments), *_compact_lines(config)]) + "\n"
    expected = to_message(config)
    parsed = text_format.Parse(text, type(expected)())
    if parsed != expected:
        raise ModelConfigError(
            f"model {config.name!r}: the compact layout does not print every field of its "
            "config; render it with render_pbtxt"
        )
    return text
