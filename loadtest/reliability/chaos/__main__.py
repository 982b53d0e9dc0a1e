"""``python -m tritonforge.loadtest.reliability.chaos``: :func:`.cli.main`."""

from tritonforge.loadtest.reliability.chaos.cli import main
from tritonforge.logs import run_main

raise SystemExit(run_main(main))
