"""``python -m tritonforge.deploy.validate``."""

from tritonforge.deploy.validate.cli import main

raise SystemExit(main())
