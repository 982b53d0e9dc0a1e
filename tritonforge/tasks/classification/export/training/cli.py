"""``python -m tritonforge.tasks.classification.export.training [--out build/classifier] [--force]``: train the default
sentiment classifier (versions 1 and 2) unless it is up to date."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tritonforge.export.errors import ExportError
from tritonforge.tasks.classification.export.training.build import DEFAULT_OUT, build


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tritonforge.tasks.classification.export.training", description=__doc__
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("TRITONFORGE_CLASSIFIER_DIR", DEFAULT_OUT)),
        help="output directory (default: $TRITONFORGE_CLASSIFIER_DIR or %(default)s)",
    )
    p.add_argument("--force", action="store_true", help="train even if the inputs are unchanged")
    args = p.parse_args(argv)
    try:
        build(args.out, force=args.force)
    except ExportError as e:
        print(f"classifier build failed: {e}", file=sys.stderr)
        return 1
    return 0
