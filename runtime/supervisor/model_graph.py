"""Which models call which, read from the repository's configs: what a broken model takes down
with it and in which order to reload (the supervisor's plan), and what the canaries call."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from pathlib import Path

from tritonforge.errors import ModelConfigError
from tritonforge.modelconfig import ModelConfig
from tritonforge.pipelines import from_repository
from tritonforge.repository import load_model_config, model_names, referenced_models


def repository_configs(repository: Path) -> dict[str, ModelConfig]:
    """Model -> its config, for every model of ``repository`` whose config parses."""
    configs: dict[str, ModelConfig] = {}
    for name in model_names(repository):
        with contextlib.suppress(ModelConfigError):
            configs[name] = load_model_config(repository, name)
    return configs


def model_calls(configs: Mapping[str, ModelConfig]) -> dict[str, set[str]]:
    """Model -> the models it calls: an ensemble's steps, a Python (BLS) model's declared
    ``*_model``/``*_models`` parameters (:func:`referenced_models`). Read from the configs only."""
    calls: dict[str, set[str]] = {}
    for name, cfg in configs.items():
        called: set[str] = set()
        if cfg.raw.get("platform") == "ensemble":
            steps = cfg.raw.get("ensemble_scheduling", {}).get("step", [])
            called |= {str(s.get("model_name", "")) for s in steps}
        called |= set(referenced_models(cfg.parameters).values())
        calls[name] = {m for m in called if m and m != name}
    return calls


def dependents(calls: Mapping[str, set[str]], models: Iterable[str]) -> set[str]:
    """Every model that calls one of ``models``, directly or through others (not ``models``)."""
    wanted = set(models)
    found: set[str] = set()
    frontier = set(wanted)
    while frontier:
        callers = {m for m, called in calls.items() if called & frontier} - found - wanted
        found |= callers
        frontier = callers
    return found


def reload_plan(calls: Mapping[str, set[str]], models: Iterable[str]) -> list[list[str]]:
    """Waves of models to reload after ``models`` broke: ``models`` first, then their
    dependents, each wave only calling models of earlier waves (a wave's loads are independent
    and may run together)."""
    first = sorted(set(models))
    todo = dependents(calls, first)
    done = set(first)
    waves = [first] if first else []
    while todo:
        wave = sorted(m for m in todo if not (calls.get(m, set()) & todo))
        if not wave:  # a cycle (the lint refuses them): load the rest together
            wave = sorted(todo)
        waves.append(wave)
        done |= set(wave)
        todo -= set(wave)
    return waves


def callees(calls: Mapping[str, set[str]], model: str) -> set[str]:
    """``model`` and every model it calls, transitively."""
    found = {model}
    frontier = {model}
    while frontier:
        frontier = {c for m in frontier for c in calls.get(m, set())} - found
        found |= frontier
    return found


def public_models(repository: Path) -> list[str]:
    """What the canaries call: every discovered pipeline's public models (ensembles, BLS; from
    the ``tritonforge.*`` parameters), plus any other model no other model calls (ensemble steps
    and declared BLS targets are internal)."""
    pipelines = from_repository(repository).values()
    members = {m for p in pipelines for m in p.models}
    configs = repository_configs(repository)
    called = {m for targets in model_calls(configs).values() for m in targets}
    others = set(configs) - called - members
    return sorted(others | {m for p in pipelines for m in p.public_models if m in configs})


def pipeline_of(repository: Path, models: Iterable[str]) -> dict[str, str]:
    """Public model -> the pipeline it belongs to (its own name when it declares none)."""
    owner = {m: p.name for p in from_repository(repository).values() for m in p.public_models}
    return {m: owner.get(m, m) for m in models}
