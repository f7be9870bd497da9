"""``python -m gpuop``: the same CLI as the ``gpuop`` console script."""

import sys

from gpuop.cli import main

sys.exit(main())
