"""Tables and number formatting. Measurements build Table objects; nothing here measures."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

MB = 2**20
NA = "-"


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        if len(cells) != len(self.headers):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.headers)} columns")
        self.rows.append([str(cell) for cell in cells])

    def render(self) -> str:
        columns = zip(self.headers, *self.rows, strict=True)
        widths = [max(len(cell) for cell in column) for column in columns]

        def line(cells: Sequence[str]) -> str:
            return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

        lines = [self.title, line(self.headers), line(["-" * w for w in widths])]
        lines += [line(row) for row in self.rows]
        return "\n".join(lines + [f"  {note}" for note in self.notes])


def seconds(value: float | None, digits: int = 1) -> str:
    return NA if value is None or math.isnan(value) else f"{value:.{digits}f}"


def rate(records: float, took: float | None) -> str:
    return f"{records / took:,.0f}" if took else NA


def count(value: float | None) -> str:
    return NA if value is None else f"{value:,.0f}"


def megabytes(size: int | None) -> str:
    return f"{size / MB:,.0f}" if size else NA


def ratio(numerator: float | None, denominator: float | None) -> str:
    return f"{numerator / denominator:.2f}x" if numerator and denominator else NA


def millis(value: float | None) -> str:
    return NA if value is None else f"{value * 1000:,.0f}"


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted sequence; None when it is empty."""
    if not ordered:
        return None
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]
