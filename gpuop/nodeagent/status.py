"""The validator's status files, ``<dir>/<check>-ready``, which other operands wait on.

The file exists exactly while the check passes. Its content is shell-sourceable
``KEY=value`` lines, so scripts in other containers can read e.g. the driver root.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

DEFAULT_VALIDATIONS_DIR = Path("/run/nvidia/validations")
CHECK_NAMES = ("driver", "toolkit", "cuda", "plugin")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.,:/@+=-]")


def _value(text: str) -> str:
    # One line, no shell metacharacters: the files may be sourced.
    return _UNSAFE.sub("_", text)


def render(fields: Mapping[str, str]) -> str:
    return "".join(f"{key}={_value(value)}\n" for key, value in fields.items())


def parse(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


class StatusFiles:
    """Reads and writes the ``*-ready`` files in one directory."""

    def __init__(self, directory: Path = DEFAULT_VALIDATIONS_DIR) -> None:
        self.directory = directory

    def path(self, check: str) -> Path:
        return self.directory / f"{check}-ready"

    def write(self, check: str, fields: Mapping[str, str]) -> None:
        """Write atomically so a reader never sees half a file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.path(check)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(render(fields))
        os.replace(tmp, target)

    def remove(self, check: str) -> None:
        self.path(check).unlink(missing_ok=True)

    def is_ready(self, check: str) -> bool:
        return self.path(check).is_file()

    def read(self, check: str) -> dict[str, str] | None:
        try:
            return parse(self.path(check).read_text())
        except FileNotFoundError:
            return None
