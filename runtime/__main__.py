"""``python -m tritonforge.runtime``: serve, demo and lint the model repository on the embedded Triton."""

from tritonforge.logs import run_main
from tritonforge.runtime.cli.main import main

raise SystemExit(run_main(main))
