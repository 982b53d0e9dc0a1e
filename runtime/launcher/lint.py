"""Repository lint: catch a broken model repository before Triton loads it.

Rules (each problem is one line naming the model and the tensor/target):
  * every model's config.pbtxt parses and its name matches the directory;
  * generated artifacts exist (encoders' model files, the tokenizer's tokenizer.json), else
    "run `make export`";
  * ensemble steps name existing models, map existing inputs/outputs with matching dtypes, feed
    every required input, and produce every ensemble output;
  * every BLS target declared in a Python model's ``parameters`` (keys ending in ``_model`` or
    ``_models``) exists, and ``embed_bls``-style chains connect for every variant;
  * a tokenizer's outputs are exactly its ``encoder_model``'s inputs (names, dtypes);
  * no model reaches itself through ensemble steps or BLS targets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tritonforge.bls import build_plan
from tritonforge.errors import ModelConfigError
from tritonforge.fused import encoder_graph
from tritonforge.modelconfig import ModelConfig
from tritonforge.pipelines import ROLE_KEY
from tritonforge.repository import (
    feed_mapping,
    load_model_config,
    model_names,
    referenced_models,
)

ARTIFACT_DEFAULTS = {"onnxruntime": "model.onnx", "pytorch": "model.pt"}


def _missing(name: str) -> str:
    return f"model {name!r} does not exist (run `make export`: it generates every pipeline model)"


def _artifacts(repo: Path, cfg: ModelConfig) -> list[str]:
    backend = str(cfg.raw.get("backend", ""))
    files: list[str] = []
    if backend in ARTIFACT_DEFAULTS:
        files.append(cfg.default_model_filename or ARTIFACT_DEFAULTS[backend])
    if backend == "python":
        files.append("model.py")
    if "tokenizer_file" in cfg.parameters:
        files.append(cfg.parameters["tokenizer_file"])
    labels = [
        f"{cfg.name}: output {o.name!r} label file {o.label_filename} is missing (run `make export`)"
        for o in cfg.outputs
        if o.label_filename and not (repo / cfg.name / o.label_filename).is_file()
    ]
    versions = sorted(p for p in (repo / cfg.name).iterdir() if p.is_dir() and p.name.isdigit())
    if not versions:
        return [f"{cfg.name}: no version directory (e.g. {cfg.name}/1/)"]
    return labels + [
        f"{cfg.name}: {f} is missing from {v.name}/ (run `make export`)"
        for v in (versions if backend in ARTIFACT_DEFAULTS else versions[-1:])
        for f in files
        if not (v / f).exists()
    ]


def _ensemble(cfg: ModelConfig, configs: Mapping[str, ModelConfig]) -> list[str]:
    problems: list[str] = []
    steps: list[dict[str, Any]] = list(cfg.raw.get("ensemble_scheduling", {}).get("step", []))
    if not steps:
        return [f"{cfg.name}: ensemble has no steps"]
    absent = [str(s.get("model_name", "")) for s in steps if s.get("model_name") not in configs]
    if absent:  # the tensor checks below would only repeat this
        return [f"{cfg.name}: step {_missing(name)}" for name in absent]
    types = {s.name: s.data_type for s in cfg.inputs}
    for step in steps:  # tensors produced by the steps
        sub = configs.get(step.get("model_name", ""))
        for out, tensor in (step.get("output_map") or {}).items():
            if sub is not None and out in {o.name for o in sub.outputs}:
                types[tensor] = sub.output(out).data_type
    for step in steps:
        name = step.get("model_name", "")
        sub = configs[name]
        inputs = {s.name: s for s in sub.inputs}
        outputs = {s.name: s for s in sub.outputs}
        in_map: dict[str, str] = step.get("input_map") or {}
        for key, tensor in in_map.items():
            if key not in inputs:
                problems.append(f"{cfg.name}: step {name!r} has no input {key!r}")
            elif tensor not in types:
                problems.append(
                    f"{cfg.name}: tensor {tensor!r} (input {key!r} of {name!r}) "
                    "is produced by no step and is not an ensemble input"
                )
            elif types[tensor] != inputs[key].data_type:
                problems.append(
                    f"{cfg.name}: tensor {tensor!r} is {types[tensor]} but input "
                    f"{key!r} of {name!r} wants {inputs[key].data_type}"
                )
        for spec in sub.inputs:
            if not spec.optional and spec.name not in in_map:
                problems.append(f"{cfg.name}: input {spec.name!r} of step {name!r} is not mapped")
        for key in step.get("output_map") or {}:
            if key not in outputs:
                problems.append(f"{cfg.name}: step {name!r} has no output {key!r}")
    for spec in cfg.outputs:
        if spec.name not in types:
            problems.append(f"{cfg.name}: ensemble output {spec.name!r} is produced by no step")
        elif types[spec.name] != spec.data_type:
            problems.append(
                f"{cfg.name}: ensemble output {spec.name!r} is {spec.data_type} "
                f"but the step produces {types[spec.name]}"
            )
    return problems


def _calls(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(what, model) pairs this model calls: ensemble steps or declared BLS targets."""
    if cfg.raw.get("platform") == "ensemble":
        steps = cfg.raw.get("ensemble_scheduling", {}).get("step", [])
        return [("step", str(s.get("model_name", ""))) for s in steps]
    return [
        (f"parameters.{key}", model) for key, model in referenced_models(cfg.parameters).items()
    ]


def _cycles(graph: Mapping[str, Iterable[str]]) -> list[tuple[list[str], str]]:
    """Every cycle as (its models, the problem line)."""
    problems: list[tuple[list[str], str]] = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                cycle = [*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt]
                problems.append((cycle, "cycle: " + " -> ".join(cycle)))
            elif nxt in graph and nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return problems


def _lint(repo: Path) -> list[tuple[tuple[str, ...], str]]:
    """Every problem, in report order, with the models it concerns (none: the repository)."""
    if not repo.is_dir():
        return [((), f"{repo}: model repository does not exist")]
    problems: list[tuple[tuple[str, ...], str]] = []
    configs: dict[str, ModelConfig] = {}
    for name in model_names(repo):
        try:
            configs[name] = load_model_config(repo, name)
        except ModelConfigError as e:
            problems.append(((name,), f"{name}: {e}"))
    if not configs and not problems:
        return [((), f"{repo}: no models found")]
    graph: dict[str, list[str]] = {}
    for name, cfg in configs.items():
        mine: list[str] = _artifacts(repo, cfg)
        calls = _calls(cfg)
        graph[name] = [model for _, model in calls]
        missing = [(what, model) for what, model in calls if model not in configs]
        if cfg.raw.get("platform") == "ensemble":
            mine += _ensemble(cfg, configs)
        else:
            mine += [f"{name}: {what} target {_missing(model)}" for what, model in missing]
        if not missing:
            try:
                if "encoder_model" in cfg.parameters:
                    feed_mapping(cfg.outputs, configs[cfg.parameters["encoder_model"]], False)
                if "encoder_models" in cfg.parameters:
                    plan = build_plan(cfg, repo)
                    if cfg.parameters.get(ROLE_KEY) == "fused":
                        encoder_graph(plan, repo)  # an ONNX Runtime encoder with a version
            except ModelConfigError as e:
                mine.append(f"{name}: {e}")
        problems += [((name,), p) for p in mine]
    problems += [(tuple(dict.fromkeys(models)), p) for models, p in _cycles(graph)]
    return problems


def lint_repository(path: Path) -> list[str]:
    """Every problem found in the model repository at ``path`` (empty list: OK)."""
    return list(dict.fromkeys(p for _, p in _lint(Path(path))))


def lint_by_model(path: Path) -> dict[str, list[str]]:
    """The problems of each model directory of ``path`` (``[]``: it lints clean on its own; what
    it calls may not), plus key ``""`` for problems of the repository itself."""
    repo = Path(path)
    out: dict[str, list[str]] = {name: [] for name in (model_names(repo) if repo.is_dir() else [])}
    for models, problem in _lint(repo):
        for model in models or ("",):
            if problem not in out.setdefault(model, []):
                out[model].append(problem)
    return out
