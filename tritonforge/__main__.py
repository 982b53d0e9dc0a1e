"""``python -m tritonforge``: the ``tritonforge`` command (see :mod:`tritonforge.cli`)."""

from tritonforge.cli import console

console()
