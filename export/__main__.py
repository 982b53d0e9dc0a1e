from tritonforge.export.cli import main
from tritonforge.logs import run_main

raise SystemExit(run_main(main))
