"""``tritonforge export msmarco`` (and ``--from-onnx``/``--from-pretrained --task rerank``):
import the cross-encoder graph (checks, grid, padded rows, sidecars), then write every config of
the pipeline and its stages' sources and tokenizer files.

The import is skipped when the served ``model.onnx`` already has the source's digest (the checks
ran when it was written; ``force`` runs them again); configs and stage files are rewritten only
where their content changed.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from tritonforge.export.onnx_import import MODEL_FILE, TOKENIZER_FILE, ImportedGraph, inspect_graph
from tritonforge.export.pipeline_configs import stage_files, write_files
from tritonforge.integrity import sha256_file
from tritonforge.tasks.rerank.export import import_reranker, package_dir, verify_pretrained
from tritonforge.tasks.rerank.export.configs import BLS, PAIR_TOKENIZER, render, rerank_configs
from tritonforge.tasks.rerank.pairs import PairTokenizer
from tritonforge.tasks.rerank.spec import RerankSpec

log = logging.getLogger(__name__)


def _served_is(source: Path, repo: Path, spec: RerankSpec) -> bool:
    served = repo / spec.encoder_model / "1" / MODEL_FILE
    sidecar = served.with_name(MODEL_FILE + ".sha256")
    return (
        served.is_file()
        and sidecar.is_file()
        and sha256_file(source / MODEL_FILE) in sidecar.read_text()
    )


def export_reranker(source: Path, repo: Path, spec: RerankSpec, force: bool = False) -> list[str]:
    """Serve ``source`` (``model.onnx`` + ``tokenizer.json``) as ``spec``'s pipeline in ``repo``;
    the repository paths written."""
    written: list[str] = []
    if force or not _served_is(source, repo, spec):
        log.info("==> [export %s] importing %s (checks, grid, padded rows)", spec.name, source)
        graph, written = import_reranker(source, repo, spec)
    else:
        log.info("==> [export %s] encoder up to date; configs only", spec.name)
        graph = _inspect(repo / spec.encoder_model / "1")
    files: dict[str, bytes] = {}
    tokenizer = (source / TOKENIZER_FILE).read_bytes()
    pad_id = PairTokenizer(source / TOKENIZER_FILE, spec.max_length, spec.truncation).pad_id
    for config, kind in rerank_configs(spec, graph, pad_id):
        files[f"{config.name}/config.pbtxt"] = render(config, spec)
        if kind is not None:
            files.update(stage_files(config.name, kind))
        if kind in (PAIR_TOKENIZER, BLS):
            files[f"{config.name}/1/{TOKENIZER_FILE}"] = tokenizer
    for config, kind in rerank_configs(spec, graph, pad_id):
        if kind is None and config.platform == "ensemble":
            (repo / config.name / "1").mkdir(parents=True, exist_ok=True)
    written += write_files(repo, files)
    log.info("==> [export %s] done: %d file(s) written", spec.name, len(written))
    return written


def _inspect(version_dir: Path) -> ImportedGraph:
    return inspect_graph(version_dir / MODEL_FILE)


def export_registered(spec: RerankSpec, repo: Path, force: bool = False) -> list[str]:
    """The registered spec's export: its model package's graph."""
    return export_reranker(package_dir(spec), repo, spec, force)


DEFAULT_MAX_LENGTH = 512


def user_spec(name: str, directory: Path, max_length: int | None = None) -> RerankSpec:
    """The spec of a user's cross-encoder served as ``name`` (``name``, ``<name>_bls``,
    ``<name>_tokenizer``, ``<name>_encoder``, ``<name>_postprocess``); ``max_length`` default
    the tokenizer.json's truncation, else :data:`DEFAULT_MAX_LENGTH`."""
    if max_length is None:
        tokenizer = directory / TOKENIZER_FILE
        truncation = (
            json.loads(tokenizer.read_text()).get("truncation") if tokenizer.is_file() else None
        )
        max_length = int((truncation or {}).get("max_length", DEFAULT_MAX_LENGTH))
    return RerankSpec(
        name=name,
        description=f"cross-encoder from {directory}",
        package="",
        package_dir="",
        max_length=max_length,
        ensemble=name,
        bls=f"{name}_bls",
        tokenizer_model=f"{name}_tokenizer",
        encoder_model=f"{name}_encoder",
        postprocess_model=f"{name}_postprocess",
    )


def export_directory(
    directory: Path,
    repo: Path,
    name: str,
    pretrained: bool,
    force: bool = False,
    max_length: int | None = None,
) -> list[str]:
    """``--from-onnx DIR`` (``model.onnx`` + ``tokenizer.json``) or ``--from-pretrained DIR`` (a
    1-label sequence classifier: exported to ONNX in a temporary directory and checked against
    PyTorch first) served as ``name``; the repository paths written."""
    spec = user_spec(name, directory, max_length)
    if not pretrained:
        return export_reranker(directory, repo, spec, force)
    with tempfile.TemporaryDirectory(prefix=f".{name}-onnx-", dir=repo.parent) as tmp:
        log.info("==> [export %s] %s -> ONNX, checked against PyTorch", name, directory)
        verify_pretrained(directory, Path(tmp), spec)
        return export_reranker(Path(tmp), repo, spec, force=True)
