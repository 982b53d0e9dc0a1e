"""``python -m client``: see :mod:`client.cli`."""

import sys

from client.cli import main

sys.exit(main())
