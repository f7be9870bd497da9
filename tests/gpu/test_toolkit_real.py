"""The toolkit check with a real ``nvidia-smi`` (what the runtime injects into the
validator's toolkit-validation container); skips where none is on ``PATH``.

Run with ``pytest -m gpu -s tests/gpu``.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from gpuop.nodeagent.toolkit import CHECK_FIELD, CHECK_SMI, ToolkitCheck

pytestmark = pytest.mark.gpu


async def test_the_toolkit_check_runs_nvidia_smi(tmp_path: Path) -> None:
    found = shutil.which("nvidia-smi")
    if found is None:
        pytest.skip("no nvidia-smi on PATH")
    smi = Path(found)
    # No runtime files under this host root: only nvidia-smi can pass the check.
    check = ToolkitCheck(tmp_path, nvidia_smi_dirs=(str(smi.parent),))
    result = await check.run()
    print(f"toolkit check: {result}")
    assert result.ok, result.reason
    assert result.fields == {CHECK_FIELD: CHECK_SMI}
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", result.facts["DRIVER_VERSION"])
