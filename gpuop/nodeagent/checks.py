"""What every validation check returns and looks like to the runner."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class CheckResult:
    """``reason`` is one line for the logs when the check failed. ``fields`` go in the
    file, exactly what upstream's validator writes there (operands source it);
    ``facts`` only in the log. ``companions``: more (empty) status files the check
    vouches for, e.g. the driver's ``nvidia-fs-ready``; they come and go with its file."""

    ok: bool
    reason: str = ""
    fields: Mapping[str, str] = field(default_factory=dict)
    companions: tuple[str, ...] = ()
    facts: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def passed(
        cls,
        fields: Mapping[str, str] | None = None,
        companions: tuple[str, ...] = (),
        facts: Mapping[str, str] | None = None,
    ) -> CheckResult:
        return cls(True, "", dict(fields or {}), companions, dict(facts or {}))

    @classmethod
    def failed(cls, reason: str) -> CheckResult:
        return cls(False, " ".join(reason.split()) or "unknown failure")


class Check(Protocol):
    """A named check. ``recheck``: cheap enough to repeat while the node is ready."""

    @property
    def name(self) -> str: ...

    @property
    def recheck(self) -> bool: ...

    async def run(self) -> CheckResult: ...
