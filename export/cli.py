"""``python -m tritonforge.export <spec> [--format onnx|torchscript|all] [--quantize int8] [--version N]``
and ``python -m tritonforge.export clean``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tritonforge.export.errors import ExportError
from tritonforge.export.pipeline import FORMATS, Options, run_export
from tritonforge.export.repository import clean
from tritonforge.export.specs import REGISTRY, get_spec

DEFAULT_REPOSITORY = Path(os.environ.get("TRITONFORGE_MODEL_REPOSITORY", "model_repository"))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tritonforge.export", description=__doc__)
    p.add_argument("spec", help=f"a registered spec ({', '.join(sorted(REGISTRY))}) or 'clean'")
    p.add_argument("--format", choices=[*FORMATS, "all"], default="all")
    p.add_argument("--quantize", choices=["int8"], default=None)
    p.add_argument("--version", type=int, default=1)
    p.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY)
    p.add_argument("--force", action="store_true", help="export even if the inputs are unchanged")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.spec == "clean":
            removed = clean(args.model_repository, [get_spec(n) for n in REGISTRY])
            print(f"==> [export clean] removed {len(removed)} item(s): {', '.join(removed) or '-'}")
            return 0
        if args.version < 1:
            raise ExportError("--version must be >= 1")
        formats = FORMATS if args.format == "all" else (args.format,)
        options = Options(
            repo=args.model_repository,
            formats=formats,
            quantize=args.quantize,
            version=args.version,
            force=args.force,
        )
        run_export(get_spec(args.spec), options)
    except ExportError as e:
        print(f"export failed: {e}", file=sys.stderr)
        return 1
    return 0
