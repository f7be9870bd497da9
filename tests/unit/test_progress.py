"""The live status line: a bar on terminals, sparse lines in logs."""

from __future__ import annotations

import io

from gpuop.progress import Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_mode_prints_each_decile_once() -> None:
    out = io.StringIO()
    bar = Progress("build", total=100, stream=out)
    for _ in range(100):
        bar.advance(1, "pkg")
    bar.finish("built")
    lines = out.getvalue().splitlines()
    # the initial line, one per 10% step, and the final message
    assert len(lines) == 12
    assert "100% (100/100)" in lines[-2]
    assert lines[-1].startswith("build: built (")


def test_tty_mode_redraws_in_place() -> None:
    out = _Tty()
    bar = Progress("nodes", total=4, stream=out)
    bar.advance(2)
    bar.finish("done")
    text = out.getvalue()
    assert text.count("\r") == 3
    assert "50% (2/4)" in text
    assert text.endswith("\n")


def test_finish_is_idempotent_and_status_without_total() -> None:
    out = io.StringIO()
    bar = Progress("wait", stream=out)
    bar.status("etcd")
    bar.finish("ok")
    bar.finish("again")
    assert out.getvalue().count("wait: ok") == 1
    assert "again" not in out.getvalue()
