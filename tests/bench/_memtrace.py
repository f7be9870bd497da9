"""``python -m tests.bench._memtrace ARGS``: ``gpuop ARGS`` under ``tracemalloc``.

For finding where the operator's memory grows with the fleet
(``GPUOP_BENCH_TRACEMALLOC=DIR``); never for the figures themselves (tracing
costs memory and CPU). SIGUSR1 writes a snapshot to ``$GPUOP_MEMTRACE_OUT`` and
then creates ``$GPUOP_MEMTRACE_OUT.done``.
"""

from __future__ import annotations

import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType


def _dump(_signum: int, _frame: FrameType | None) -> None:
    out = Path(os.environ["GPUOP_MEMTRACE_OUT"])
    tracemalloc.take_snapshot().dump(str(out))
    out.with_name(out.name + ".done").touch()


def main() -> int:
    tracemalloc.start(int(os.environ.get("GPUOP_MEMTRACE_FRAMES", "12")))
    signal.signal(signal.SIGUSR1, _dump)
    from gpuop.cli import main as gpuop_main

    sys.argv[0] = "gpuop"
    return gpuop_main()


if __name__ == "__main__":
    sys.exit(main())
