"""``python -m tritonforge.loadtest.bench``: the documented spelling of :func:`.cli.main`."""

from tritonforge.loadtest.bench.cli import main
from tritonforge.logs import run_main

raise SystemExit(run_main(main))
