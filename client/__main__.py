"""``python -m tritonforge.client``: see :mod:`client.cli`."""

from tritonforge.client.cli import main
from tritonforge.logs import run_main

raise SystemExit(run_main(main))
