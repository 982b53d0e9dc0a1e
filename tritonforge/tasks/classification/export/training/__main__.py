import os

# Passive OpenMP waits: on a shared, oversubscribed machine spinning threads wait for descheduled
# peers (measured here under load 9: a small matmul's forward + backward 20 ms instead of 1 ms).
# Must be set before torch loads its OpenMP runtime; it changes speed, not results.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tritonforge.logs import run_main
from tritonforge.tasks.classification.export.training.cli import main

raise SystemExit(run_main(main))
