"""``python -m client``: see :mod:`client.cli`."""

from client.cli import main
from tritonforge.env import run_main

raise SystemExit(run_main(main))
