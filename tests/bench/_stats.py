"""Summaries (median, min, max over repetitions) and the printed table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Summary:
    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary | None:
        if not values:
            return None
        return cls(statistics.median(values), min(values), max(values), len(values))

    def as_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.2f}"
    if unit == "ms":
        return f"{value:.1f}"
    if unit == "MiB":
        return f"{value:.1f}"
    if unit in ("x", "cores"):
        return f"{value:.2f}"
    return f"{value:g}"


@dataclass
class Row:
    figure: str
    size: str
    metric: str
    unit: str
    value: Summary | None = None
    text: str = ""
    target: str = ""

    def cells(self) -> list[str]:
        if self.value is None:
            shown, spread, n = self.text or "n/a", "", ""
        else:
            v = self.value
            shown = _fmt(v.median, self.unit)
            spread = f"{_fmt(v.low, self.unit)} .. {_fmt(v.high, self.unit)}" if v.n > 1 else ""
            n = str(v.n)
        return [self.figure, self.size, self.metric, self.unit, shown, spread, n, self.target]

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "figure": self.figure,
            "size": self.size,
            "metric": self.metric,
            "unit": self.unit,
            "target": self.target,
        }
        if self.value is not None:
            out.update(self.value.as_dict())
        if self.text:
            out["text"] = self.text
        return out


HEADER = ["fig", "GPU nodes", "metric", "unit", "median", "min .. max", "n", "target"]


def render_table(rows: Sequence[Row], markdown: bool = False) -> str:
    table = [HEADER, *(r.cells() for r in rows)]
    if markdown:
        lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in table[1:]]
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    out = []
    for index, row in enumerate(table):
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
