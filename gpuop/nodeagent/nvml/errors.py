"""Typed NVML failures.

Callers branch on what went wrong (no library, no driver, a lost GPU, a field the
device lacks), never on pynvml's numeric codes, so the fake and the real binding
raise the same classes.
"""

from __future__ import annotations


class NvmlError(Exception):
    """Base of every NVML failure; ``code`` is NVML's return code when one is known."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class LibraryNotFound(NvmlError):
    """``libnvidia-ml.so.1`` could not be loaded from the driver root."""


class DriverNotLoaded(NvmlError):
    """The library loaded but the kernel driver is not running."""


class GpuLost(NvmlError):
    """The GPU fell off the bus or needs a reset; it answers nothing until then."""


class NotSupported(NvmlError):
    """This device or driver does not offer the queried field (e.g. MIG on a T4)."""


class Unknown(NvmlError):
    """Any other NVML failure; ``code`` keeps NVML's return code for the logs."""
