from export.cli import main
from tritonforge.env import run_main

raise SystemExit(run_main(main))
