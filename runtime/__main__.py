"""``python -m runtime``: serve, demo and lint the model repository on the embedded Triton."""

from runtime.cli import main
from tritonforge.env import run_main

raise SystemExit(run_main(main))
