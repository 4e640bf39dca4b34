"""`python -m gpuwatch.cli`: the command line, as `gpuwatch` and `python -m gpuwatch` run it."""

import sys

from gpuwatch.cli import main

sys.exit(main())
