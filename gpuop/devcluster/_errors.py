"""The one error type the local cluster raises for anything a user can fix."""

from __future__ import annotations


class ClusterError(Exception):
    """A failure with a one-line cause and what to do about it.

    The CLI prints ``str(err)`` and exits non-zero; no traceback is shown for
    these, because they are the user's to fix (missing ``go``, a port in use, ...).
    """

    def __init__(self, cause: str, hint: str = "") -> None:
        self.cause = cause
        self.hint = hint
        super().__init__(f"{cause} — {hint}" if hint else cause)


class PortTaken(ClusterError):
    """A process could not bind the port chosen for it: another took it in between
    (free ports are picked by binding port 0, then released), so a retry picks anew."""
