"""Config-only model repositories for unit tests: ``config.pbtxt`` files carrying the
``tritonforge.*`` parameters that discovery reads (no model files, nothing to serve)."""

from __future__ import annotations

from pathlib import Path


def write_model(
    repo: Path,
    name: str,
    pipeline: str,
    role: str,
    task: str = "classification",
    variant: str | None = None,
    output: str = 'output { name: "probabilities" data_type: TYPE_FP32 dims: [3] }',
) -> Path:
    params = {
        "tritonforge.pipeline": pipeline,
        "tritonforge.task": task,
        "tritonforge.role": role,
        **({"tritonforge.variant": variant} if variant else {}),
    }
    model = repo / name
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\n'
        'input { name: "text" data_type: TYPE_STRING dims: [1] }\n'
        f"{output}\n"
        + "".join(
            f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n'
            for k, v in params.items()
        )
    )
    return model


def write_pipeline(repo: Path, pipeline: str, prefix: str, task: str = "classification") -> None:
    """Tokenizer, fp32 + int8 encoders, fp32 + int8 ensembles and a BLS named like export does."""
    write_model(repo, f"{prefix}tokenizer", pipeline, "tokenizer", task)
    for variant in ("fp32", "int8"):
        write_model(repo, f"{prefix}encoder_{variant}", pipeline, "encoder", task, variant)
        public = pipeline if variant == "fp32" else f"{pipeline}_{variant}"
        write_model(repo, public, pipeline, "ensemble", task, variant)
    write_model(repo, f"{pipeline}_bls", pipeline, "bls", task)
