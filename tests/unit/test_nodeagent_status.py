"""Status files: exist while a check passes, sourceable key=value content."""

from __future__ import annotations

from pathlib import Path

from gpuop.nodeagent.status import StatusFiles, parse, render


def test_write_read_remove(tmp_path: Path) -> None:
    files = StatusFiles(tmp_path / "validations")
    files.write("driver", {"DRIVER_VERSION": "595.91.07", "IS_HOST_DRIVER": "false"})
    path = tmp_path / "validations" / "driver-ready"
    assert path.read_text() == "DRIVER_VERSION=595.91.07\nIS_HOST_DRIVER=false\n"
    assert files.is_ready("driver")
    assert files.read("driver") == {"DRIVER_VERSION": "595.91.07", "IS_HOST_DRIVER": "false"}
    assert list((tmp_path / "validations").iterdir()) == [path]  # no temp file left
    files.remove("driver")
    files.remove("driver")  # idempotent
    assert not files.is_ready("driver")
    assert files.read("driver") is None


def test_values_cannot_break_the_file() -> None:
    text = render({"REASON": "a b\nEVIL=1; rm -rf /"})
    assert text.count("\n") == 1
    assert parse(text)["REASON"].startswith("a_b_EVIL=1")
