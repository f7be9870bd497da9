"""A live status line for long-running commands (builds, cluster start-up).

On a terminal it redraws one line in place; elsewhere (CI logs) it prints a
line at every 10% step or every 30 seconds, so logs show life without flooding.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

_BAR_WIDTH = 28
_QUIET_LOG_SECONDS = 30.0


def _fmt_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Progress:
    """A progress bar (when ``total`` is known) or a spinner-free status line."""

    def __init__(self, label: str, total: int | None = None, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.detail = ""
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty()
        self._start = time.monotonic()
        self._last_log = self._start
        self._last_decile = -1
        self._closed = False
        self._render(force=True)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def advance(self, n: int = 1, detail: str = "") -> None:
        self.done += n
        if detail:
            self.detail = detail
        self._render()

    def status(self, detail: str) -> None:
        self.detail = detail
        self._render()

    def _line(self) -> str:
        elapsed = _fmt_elapsed(self.elapsed)
        if self.total:
            frac = min(1.0, self.done / self.total)
            filled = int(frac * _BAR_WIDTH)
            bar = "#" * filled + "." * (_BAR_WIDTH - filled)
            head = f"{self.label} [{bar}] {frac * 100:3.0f}% ({self.done}/{self.total})"
        else:
            head = f"{self.label}"
        tail = f" {self.detail}" if self.detail else ""
        return f"{head} {elapsed}{tail}"

    def _render(self, force: bool = False) -> None:
        if self._closed:
            return
        if self._tty:
            width = 118
            self._stream.write("\r" + self._line()[:width].ljust(width))
            self._stream.flush()
            return
        now = time.monotonic()
        decile = int(10 * self.done / self.total) if self.total else -1
        if force or decile > self._last_decile or now - self._last_log >= _QUIET_LOG_SECONDS:
            self._last_decile = max(decile, self._last_decile)
            self._last_log = now
            self._stream.write(self._line() + "\n")
            self._stream.flush()

    def finish(self, message: str) -> None:
        """End the line with a final message (always printed)."""
        if self._closed:
            return
        self._closed = True
        text = f"{self.label}: {message} ({_fmt_elapsed(self.elapsed)})"
        if self._tty:
            self._stream.write("\r" + text.ljust(118) + "\n")
        else:
            self._stream.write(text + "\n")
        self._stream.flush()
