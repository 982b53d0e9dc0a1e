"""Which models serve which pipeline: discovered, never restated.

Every public model of a tritonforge pipeline carries ``tritonforge.*`` config parameters
(:mod:`tritonforge.pipelines`); :func:`tritonforge.pipelines.discover` turns configs into
:class:`~tritonforge.pipelines.Pipeline` objects. The clients get the configs from the server
(repository index + model configs: restricted APIs, so the admin key ``$TRITONFORGE_ADMIN_KEY`` is
sent when set) or, offline, from a repository on disk. Sources, first that answers:

1. ``repository=`` / ``$TRITONFORGE_MODEL_REPOSITORY``: the repository on disk (no server call);
2. the server's model configs (with the admin key when one is set);
3. where the server refuses the configs (no admin key), ``./model_repository`` when it exists.

The *default* pipeline of a task is the one named (``name=`` / ``$TRITONFORGE_PIPELINE_NAME``),
else the only one of that task, else the one whose stages are unprefixed (the repository's primary
pipeline, e.g. the default embedding model's); anything else is ambiguous and asks for a name.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tritonforge.client.errors import (
    ClientError,
    DiscoveryError,  # re-exported: its old home
    InvalidRequestError,
    ModelNotFoundError,
)
from tritonforge.env import env_str
from tritonforge.pipelines import (
    PIPELINE_KEY,
    ROUTES,
    VARIANT_PARAMETER,
    Pipeline,
    StageNames,
    discover,
    from_repository,
)

ADMIN_KEY_ENV = "TRITONFORGE_ADMIN_KEY"
REPOSITORY_ENV = "TRITONFORGE_MODEL_REPOSITORY"
NAME_ENV = "TRITONFORGE_PIPELINE_NAME"
DEFAULT_REPOSITORY = Path("model_repository")


def admin_headers(protocol: str, admin_key: str | None) -> dict[str, str]:
    """Headers (HTTP) or metadata (gRPC) that unlock the restricted config APIs; {} without key."""
    if not admin_key:
        return {}
    from tritonforge.headers import ADMIN_HEADER, GRPC_ADMIN_HEADER

    return {(ADMIN_HEADER if protocol == "http" else GRPC_ADMIN_HEADER): admin_key}


def configured_repository(repository: Path | str | None = None) -> Path | None:
    """``repository``, else ``$TRITONFORGE_MODEL_REPOSITORY``, else None."""
    chosen = repository if repository is not None else env_str(REPOSITORY_ENV)
    return Path(chosen) if chosen else None


def offline(repository: Path) -> dict[str, Pipeline]:
    """The pipelines of a repository on disk; :class:`DiscoveryError` when it declares none."""
    if not Path(repository).is_dir():
        raise DiscoveryError(f"model repository {repository} does not exist")
    found = from_repository(Path(repository))
    if not found:
        raise DiscoveryError(
            f"{repository} declares no tritonforge pipeline (no model has a {PIPELINE_KEY!r} "
            "parameter): run `make export`"
        )
    return found


def grpc_config(response: Any) -> dict[str, Any]:
    """A gRPC ``ModelConfigResponse`` in Triton's JSON form (TYPE_* names, integer dims)."""
    from google.protobuf import text_format

    from tritonforge.modelconfig import pbtxt_to_dict

    return pbtxt_to_dict(text_format.MessageToString(response.config))


def index_names(index: Any) -> list[str]:
    """Model names of a repository index (HTTP: a list; gRPC JSON: ``{"models": [...]}``)."""
    rows = index.get("models", []) if isinstance(index, Mapping) else index
    return sorted({str(r["name"]) for r in rows if str(r.get("state", "READY")) == "READY"})


def refused(err: ClientError) -> bool:
    """The server withheld the restricted APIs (no or a wrong admin key)."""
    text = str(err).lower()
    return "restricted" in text or "permission" in text or "unauthenticated" in text


def fallback(error: InvalidRequestError, context: str) -> dict[str, Pipeline]:
    """Source 3's pipelines when the server refused its configs (:func:`fallback_repository`)."""
    return offline(fallback_repository(error, context))


def fallback_repository(error: InvalidRequestError, context: str) -> Path:
    """Source 3 (``./model_repository``) when the server refused its configs, else a
    :class:`DiscoveryError` saying how to give the client access."""
    if refused(error) and DEFAULT_REPOSITORY.is_dir():
        return DEFAULT_REPOSITORY
    raise DiscoveryError(
        f"{context}: cannot read the model configs to discover the pipelines ({error}); set "
        f"${ADMIN_KEY_ENV} (the server's admin key) or ${REPOSITORY_ENV} (its repository)",
        attempts=error.attempts,
    ) from error


def served(configs: list[dict[str, Any]], context: str) -> dict[str, Pipeline]:
    """The pipelines the server's configs declare (at least one, else :class:`DiscoveryError`)."""
    found = discover(configs)
    if not found:
        raise DiscoveryError(f"{context}: the server serves no tritonforge pipeline")
    return found


def choose(pipelines: Mapping[str, Pipeline], task: str, name: str | None = None) -> Pipeline:
    """The pipeline ``name`` (it must have ``task``), else the default of ``task`` (module doc).

    :class:`ModelNotFoundError` names the field ``name`` and lists what was discovered.
    """
    of_task = {n: p for n, p in pipelines.items() if p.task == task}
    if name:
        if name not in pipelines:
            raise ModelNotFoundError(
                f"unknown pipeline name={name!r}; the server has {sorted(pipelines)}"
            )
        if pipelines[name].task != task:
            raise InvalidRequestError(
                f"pipeline name={name!r} is a {pipelines[name].task} pipeline, not {task}; "
                f"{task} pipelines: {sorted(of_task)}"
            )
        return pipelines[name]
    if len(of_task) == 1:
        return next(iter(of_task.values()))
    primary = [p for p in of_task.values() if StageNames(p.name, "").tokenizer() in p.models]
    if len(primary) == 1:
        return primary[0]
    if not of_task:
        raise ModelNotFoundError(f"the server has no {task} pipeline; it has {sorted(pipelines)}")
    raise InvalidRequestError(
        f"several {task} pipelines {sorted(of_task)}: pass name= (or ${NAME_ENV})"
    )


def check_orchestration(orchestration: str) -> str:
    """``orchestration`` (a call's ``route``; ``pipeline`` is its old name) if it is one."""
    if orchestration not in ROUTES:
        raise InvalidRequestError(
            f"unknown route={orchestration!r} (old name: pipeline=); expected one of {ROUTES}"
        )
    return orchestration


def route(pipeline: Pipeline, orchestration: str, variant: str) -> tuple[str, dict[str, str]]:
    """Model name and request parameters for ``variant`` of ``pipeline`` through ``orchestration``
    (``ensemble``: one model per variant; ``bls``: one model, the variant a request parameter).

    :class:`InvalidRequestError` names the field (``route`` / ``variant``) and the choices.
    """
    check_orchestration(orchestration)
    if orchestration == "bls":
        if pipeline.bls is None:
            raise InvalidRequestError(f"pipeline {pipeline.name!r} has no BLS model: use ensemble")
        if variant not in pipeline.bls_variants:
            raise InvalidRequestError(
                f"unknown variant={variant!r} for {pipeline.bls!r}; it serves "
                f"{list(pipeline.bls_variants)}"
            )
        return pipeline.bls, {VARIANT_PARAMETER: variant}
    if variant not in pipeline.ensembles:
        raise InvalidRequestError(
            f"unknown variant={variant!r} for pipeline {pipeline.name!r}; its ensembles serve "
            f"{list(pipeline.variants)}"
        )
    return pipeline.ensembles[variant], {}


def check_limits(texts: list[str], pipeline: Pipeline) -> None:
    """``texts`` within the pipeline's ``max_items`` and ``max_text_bytes`` (its public models'
    parameters), else :class:`InvalidRequestError` naming the field."""
    if len(texts) > pipeline.max_items:
        raise InvalidRequestError(
            f"texts has {len(texts)} items; pipeline {pipeline.name!r} takes at most "
            f"max_items={pipeline.max_items} per call"
        )
    if pipeline.max_text_bytes:
        for i, text in enumerate(texts):
            size = len(text.encode("utf-8"))
            if size > pipeline.max_text_bytes:
                raise InvalidRequestError(
                    f"texts[{i}] is {size} bytes; pipeline {pipeline.name!r} takes at most "
                    f"max_text_bytes={pipeline.max_text_bytes}"
                )


def select(
    pipelines: Mapping[str, Pipeline],
    task: str,
    name: str | None,
    orchestration: str,
    variant: str,
) -> tuple[Pipeline, str, dict[str, str]]:
    """(pipeline, model, request parameters) of one call: :func:`choose` then :func:`route`."""
    pipeline = choose(pipelines, task, name)
    model, parameters = route(pipeline, orchestration, variant)
    return pipeline, model, parameters
