"""Tables and number formatting. Measurements build Table objects; nothing here measures.
With --repeat, the tables of a section's runs are merged cell by cell into one (aggregate)."""

from __future__ import annotations

import math
import re
import statistics
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


def decimal(value: float | None, digits: int = 1) -> str:
    return NA if value is None else f"{value:,.{digits}f}"


def rate(records: float, took: float | None) -> str:
    return f"{records / took:,.0f}" if took else NA


def count(value: float | None) -> str:
    return NA if value is None else f"{value:,.0f}"


def megabytes(size: int | None) -> str:
    return f"{size / MB:,.0f}" if size else NA


def ratio(numerator: float | None, denominator: float | None) -> str:
    return f"{numerator / denominator:.2f}x" if numerator and denominator else NA


def per_record_us(cpu_seconds: float | None, records: float | None) -> str:
    """CPU microseconds per record."""
    return f"{cpu_seconds / records * 1e6:,.1f}" if cpu_seconds and records else NA


def millis(value: float | None) -> str:
    return NA if value is None else f"{value * 1000:,.0f}"


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted sequence; None when it is empty."""
    if not ordered:
        return None
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


# ---- --repeat: one table from several runs of a section ----------------------------------------

NUMBER = re.compile(r"^(-?[\d,]*\.?\d+)(x?)$")  # what the formatters above print


def aggregate(runs: Sequence[Table]) -> Table:
    """One table from the same section's runs: each numeric cell that differs between runs
    becomes 'median (min-max)'; other cells that differ list their values. Rows are matched by
    position: every run adds the same rows in the same order."""
    first = runs[0]
    if len(runs) == 1:
        return first
    title = f"{first.title}  [median (min-max) of {len(runs)} runs]"
    if any(run.headers != first.headers or len(run.rows) != len(first.rows) for run in runs):
        note = f"runs produced different rows: run 1 of {len(runs)} shown (see each run above)"
        return Table(title, first.headers, first.rows, [*first.notes, note])
    same_rows = zip(*(run.rows for run in runs), strict=True)  # row i of every run
    rows = [[merge(cells) for cells in zip(*row, strict=True)] for row in same_rows]
    return Table(title, first.headers, rows, list(first.notes))


def merge(cells: Sequence[str]) -> str:
    """'97.9k (95.1k-99.0k)' from numbers (k: thousands, M: millions; '; 1 n/a': a run
    without one), distinct texts joined with ' / '."""
    if len(set(cells)) == 1:
        return cells[0]
    found = [m for cell in cells if (m := NUMBER.match(cell))]
    missing = sum(cell == NA for cell in cells)
    if not found or len(found) + missing != len(cells):
        return " / ".join(dict.fromkeys(cells))
    values = [float(m[1].replace(",", "")) for m in found]
    digits = max(len(m[1].partition(".")[2]) for m in found)
    suffix = found[0][2]

    def show(value: float) -> str:
        return compact(value, digits) + suffix

    absent = f"; {missing} n/a" if missing else ""
    return f"{show(statistics.median(values))} ({show(min(values))}-{show(max(values))}{absent})"


def compact(value: float, digits: int) -> str:
    if abs(value) >= 1e6:
        return f"{value / 1e6:.2f}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.1f}k"
    return f"{value:,.{digits}f}"
