"""python -m gpuwatch.supervisor --run-dir DIR [--socket PATH] [--fresh]"""

import sys

from gpuwatch.supervisor.core import main

sys.exit(main())
