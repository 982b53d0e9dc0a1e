"""``python -m tritonforge.tasks.image.loadtest``: the skew report (see the package)."""

from tritonforge.tasks.image.loadtest import main

raise SystemExit(main())
