from tritonforge.env import run_main
from tritonforge.export.cli import main

raise SystemExit(run_main(main))
