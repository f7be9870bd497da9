"""`maxUnavailable` as a node count: shared by the upgrade budget
(:mod:`statemachine.budget`) and the owner hand-over budget
(:mod:`statemachine.driver_owner`), which the budget module imports (so this cannot
live there)."""

from __future__ import annotations

import math
import re

_PERCENT = re.compile(r"^\s*(\d+)\s*%\s*$")


def resolve_max_unavailable(value: int | str, total_gpu_nodes: int) -> int:
    """`maxUnavailable` as a node count. Percentages round up, like upstream.

    Raises ValueError naming the field for negative numbers and for strings that are
    not `<digits>%` (a bare "3" is not valid IntOrString, as in Kubernetes).
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"maxUnavailable must be an int or a percent string, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"maxUnavailable must not be negative, got {value}")
        return value
    match = _PERCENT.match(value)
    if match is None:
        raise ValueError(f"maxUnavailable must be an int or a percent like '25%', got {value!r}")
    return math.ceil(int(match.group(1)) * max(total_gpu_nodes, 0) / 100)
