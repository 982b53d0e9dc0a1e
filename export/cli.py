"""Export a pipeline into the model repository:

    python -m tritonforge.export minilm [--format onnx|torchscript|all] [--quantize int8]
                                        [--target cpu|gpu]
    python -m tritonforge.export --from-pretrained DIR --task embedding|classification [--name N]
    python -m tritonforge.export --from-pretrained DIR | --gguf FILE --task generation --name N
    python -m tritonforge.export clean

A registered spec or any Hugging Face checkpoint directory (config.json, safetensors,
tokenizer.json) takes the same road: encoders exported and verified, then every config of the
pipeline generated. Without --format/--quantize the spec's variants are exported (all three).
A causal LM (--task generation: Llama, Mistral, Qwen2/3, Gemma 3, Phi-3), and a registered
decoder spec such as smollm2, is served as N (the fastest variant through its gate; --quantize
none: fp32 only) and N_fp32.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from tritonforge import tasks
from tritonforge.export.encoder import FORMATS, Options, export_pipeline
from tritonforge.export.errors import ExportError
from tritonforge.export.pipeline_configs import stage_files, write_files
from tritonforge.export.pipeline_spec import PipelineSpec
from tritonforge.export.spec import CPU_TARGET, GPU_TARGET, TARGETS
from tritonforge.export.specs import (
    REGISTRY,
    decoder_names,
    get_decoder,
    get_entry,
    get_pipeline,
)
from tritonforge.export.staging import clean
from tritonforge.pipelines import pipeline_models

PROG = "python -m tritonforge.export"
TARGET_ENV = "TRITONFORGE_EXPORT_TARGET"
DEFAULT_REPOSITORY = Path(os.environ.get("TRITONFORGE_MODEL_REPOSITORY", "model_repository"))
log = logging.getLogger(__name__)


def parser() -> argparse.ArgumentParser:
    """The export command's arguments (options before or after the spec)."""
    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=raw)
    known = ", ".join(sorted(REGISTRY))
    p.add_argument("spec", nargs="?", help=f"a registered spec ({known}) or 'clean'")
    p.add_argument("--from-pretrained", type=Path, metavar="DIR", help="a Hugging Face checkpoint")
    p.add_argument(
        "--from-onnx", type=Path, metavar="DIR", help="model.onnx + tokenizer.json (rerank)"
    )
    p.add_argument("--gguf", type=Path, metavar="FILE", help="a GGUF causal LM (--task generation)")
    p.add_argument("--task", choices=tasks.names(), help="with a checkpoint: what to serve")
    p.add_argument("--name", help="with a checkpoint: the served name (default: DIR's)")
    p.add_argument("--max-length", type=int, help="with --from-pretrained: tokens per text")
    p.add_argument("--format", choices=[*FORMATS, "all"], default=None)
    p.add_argument("--quantize", choices=["int8", "none"], default=None)
    p.add_argument("--version", type=int, default=1)
    p.add_argument(
        "--target",
        choices=[*TARGETS, "all"],
        default=os.environ.get(TARGET_ENV) or CPU_TARGET,
        help="deployment target of the int8 graphs: cpu (default), gpu or all also builds the "
        f"TensorRT hosts' int8 graph when the spec's method differs (env {TARGET_ENV})",
    )
    p.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY)
    p.add_argument("--force", action="store_true", help="export even if the inputs are unchanged")
    return p


def _named(args: argparse.Namespace) -> list[object]:
    return [
        x for x in (args.spec, args.from_pretrained, args.from_onnx, args.gguf) if x is not None
    ]


def names_an_export(argv: Sequence[str]) -> bool:
    """True when ``argv`` names what to export (a spec or a checkpoint), before, between or after
    the options; False means the default exports (``tritonforge export [OPTIONS]``)."""
    args, _ = parser().parse_known_intermixed_args(list(argv))
    return bool(_named(args))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_intermixed_args(argv)  # options before or after the spec
    if len(_named(args)) != 1:
        p.error(
            "give one of: a registered spec, 'clean', --from-pretrained DIR, --from-onnx DIR, "
            "--gguf FILE"
        )
    if args.spec is None and args.task is None:
        p.error(f"a checkpoint needs --task {'|'.join(tasks.names())}")
    generators = tasks.names(tasks.GENERATOR)
    if args.gguf is not None and args.task not in generators:
        p.error(f"--gguf takes --task {'|'.join(generators)} (a causal LM)")
    if args.from_onnx is not None and args.task not in _own_kinds():
        p.error(f"--from-onnx serves a task of its own kind: {_own_kinds()}")
    if args.task in generators and args.name is None:
        p.error(f"--task {args.task} needs --name NAME (the served model's name)")
    return args


def _servable() -> list[str]:
    return [n for n in tasks.names() if tasks.get(n).kind != tasks.GENERATOR]


def _own_kinds() -> list[str]:
    return [n for n in _servable() if tasks.get(n).kind != tasks.PIPELINE]


def options_for(pipeline: PipelineSpec, args: argparse.Namespace) -> Options:
    """Formats and int8 from the flags, else from the spec's variants."""
    if args.version < 1:
        raise ExportError("--version must be >= 1")
    if args.target not in (*TARGETS, "all"):  # argparse does not check a default from the env
        raise ExportError(f"{TARGET_ENV}={args.target!r}: use one of {[*TARGETS, 'all']}")
    if args.format is None:
        formats = ("onnx", *(("torchscript",) if "torchscript" in pipeline.variants else ()))
    else:
        formats = FORMATS if args.format == "all" else (args.format,)
    if args.quantize is None:
        quantize = "int8" if "int8" in pipeline.variants else None
    else:
        quantize = None if args.quantize == "none" else args.quantize
    return Options(
        repo=args.model_repository,
        formats=formats,
        quantize=quantize,
        version=args.version,
        force=args.force,
        targets=TARGETS if args.target in ("all", GPU_TARGET) else (CPU_TARGET,),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.spec == "clean":
            _clean(args.model_repository)
        elif _generator(args):
            _export_decoder(args)
        elif args.spec is not None and _kind(args.spec) != tasks.PIPELINE:
            _export_own_kind(args)
        elif args.spec is None and tasks.get(args.task).kind != tasks.PIPELINE:
            _export_own_directory(args)
        else:
            _export_pipeline(args)
    except ExportError as e:
        log.error("export failed: %s", e)
        return 1
    return 0


def _kind(spec: str) -> str:
    return tasks.get(get_entry(spec).task).kind


def _generator(args: argparse.Namespace) -> bool:
    """A decoder export: a registered decoder spec, or a checkpoint given with a generator task."""
    if args.spec is not None:
        return _kind(args.spec) == tasks.GENERATOR
    return tasks.get(args.task).kind == tasks.GENERATOR


def _export_own_kind(args: argparse.Namespace) -> None:
    """A task of its own kind exports itself: its ``export.run.export_registered``."""
    entry = get_entry(args.spec)
    run = tasks.get(entry.task).module("export.run")
    run.export_registered(entry(), args.model_repository, args.force)


def _export_own_directory(args: argparse.Namespace) -> None:
    """``--from-onnx``/``--from-pretrained DIR --task T`` of a task of its own kind: its
    ``export.run.export_directory``."""
    directory: Path = args.from_pretrained or args.from_onnx
    run = tasks.get(args.task).module("export.run")
    run.export_directory(
        directory,
        args.model_repository,
        args.name or directory.resolve().name,
        pretrained=args.from_pretrained is not None,
        force=args.force,
        max_length=args.max_length,
    )


def _generator_export(module: str, task: str | None = None) -> ModuleType:
    """A generator task's export module ``module`` (``config``, ``steps``, ``pretrained``);
    ``task``: the default generator task when None."""
    return tasks.get(task or tasks.default(tasks.GENERATOR).name).module(f"export.{module}")


def _clean(repo: Path) -> None:
    removed = clean(repo, pipeline_models(repo) if repo.is_dir() else [])
    decoders = [get_decoder(n) for n in decoder_names()]
    removed += _generator_export("config").clean_decoders(repo, decoders)
    log.info("==> [export clean] removed %d item(s): %s", len(removed), ", ".join(removed) or "-")


def decoder_int8(quantize: str | None, variants: Sequence[str]) -> bool:
    """Whether a decoder export builds int8: the spec's variants say so unless ``--quantize
    none`` (a registered spec named alone exports what ``make export`` does, as a checkpoint
    does: exporting only fp32 there would replace the served int8 default with fp32)."""
    return quantize != "none" and "int8" in variants


def _export_decoder(args: argparse.Namespace) -> None:
    task = get_entry(args.spec).task if args.spec is not None else args.task
    if args.spec is not None:
        spec = get_decoder(args.spec)
    else:
        pretrained = _generator_export("pretrained", task)
        spec = pretrained.decoder_from_pretrained(args.from_pretrained or args.gguf, args.name)
    int8 = decoder_int8(args.quantize, spec.serving.variants)
    _generator_export("steps", task).run_decoder_export(
        spec, args.model_repository, int8, args.force
    )
    # the served names (int8 may have failed its gate), which the export's report records
    config = _generator_export("config", task)
    served = config.int8_served(spec, args.model_repository, int8)
    for model in config.models(spec, served).values():
        write_files(args.model_repository, stage_files(model, "generate"))


def _export_pipeline(args: argparse.Namespace) -> None:
    if args.from_pretrained is not None:
        from tritonforge.export.specs.from_pretrained import pipeline_from_pretrained

        pipeline = pipeline_from_pretrained(
            args.from_pretrained, args.task, args.name, max_length=args.max_length
        )
    else:
        pipeline = get_pipeline(args.spec)
    export_pipeline(pipeline, options_for(pipeline, args))
