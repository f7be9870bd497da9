"""``python -m tests.dashboard_file``: write components/data/gpu-operator-dashboard.json
(the chart and deploy/monitoring link to it) from its one source, components/dashboard.py.
tests/unit/test_dashboard.py fails while the committed file differs from the generator's
output."""

from __future__ import annotations

import sys
from pathlib import Path

from components.dashboard import render
from components.monitoring import DASHBOARD_FILE

ROOT = Path(__file__).resolve().parents[1]
PATH = ROOT / "components" / "data" / DASHBOARD_FILE

if __name__ == "__main__":
    PATH.write_text(render(), encoding="utf-8")
    print(f"wrote {PATH.relative_to(ROOT)}", file=sys.stderr)
