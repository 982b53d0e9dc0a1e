"""``python -m runtime``: serve, demo and lint the model repository on the embedded Triton."""

from runtime.cli import main

raise SystemExit(main())
