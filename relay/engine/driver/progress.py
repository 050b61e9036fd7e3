"""Live progress: a rich table on a terminal, plain log lines at a steady rate otherwise.

It only reads `Status.snapshot()`, on its own thread, so drawing never slows the relay.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

from rich.console import Console, Group, JustifyMethod
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from relay.engine.driver.rows import PartitionRow, Snapshot

log = logging.getLogger(__name__)


def eta(snap: Snapshot) -> float | None:
    """Seconds to the --stop-at-end targets at the current rate (None: unknown)."""
    remaining = snap.remaining
    if remaining is None or snap.rate <= 0:
        return None
    return remaining / snap.rate


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


MAX_ROWS = 24  # more partitions than this are shown per topic


COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("source", "left"),
    ("partition", "right"),
    ("target", "left"),
    ("relayed", "right"),
    ("filtered", "right"),
    ("rate/s", "right"),
    ("lag", "right"),
)


def render(snap: Snapshot, title: str = "relay") -> Group:
    """The terminal view: a row per source partition (per topic when there are many), totals,
    and a bar for --stop-at-end. Rows of partitions other group members relay show "-"."""
    parts: list[Table | Text | ProgressBar] = [_table(snap, title)]
    if snap.remaining is not None:
        done = snap.relayed + snap.filtered
        total = done + snap.remaining
        parts.append(ProgressBar(total=max(total, 1), completed=done, width=60))
        parts.append(
            Text(f"{done:,} / {total:,} records to the end offsets, ETA {_fmt_eta(eta(snap))}")
        )
    parts += [Text(line, style="yellow") for line in snap.trouble]
    parts += [Text(f"halted: {halt.where}", style="red") for halt in snap.halted]
    if snap.lost:
        parts.append(Text(f"{snap.lost:,} source records lost before they were copied", "red"))
    return Group(*parts)


def _table(snap: Snapshot, title: str) -> Table:
    title = f"ktm {title} - source: {snap.active_node or '?'}"
    if snap.members > 1:
        title += f" - {len(snap.owned)} of {len(snap.rows)} partitions here, {snap.members} members"
    table = Table(title=title, expand=False)
    for name, justify in COLUMNS:
        table.add_column(name, justify=justify)
    for cells in _rows(snap):
        table.add_row(*cells)
    totals = (f"{snap.relayed:,}", f"{snap.filtered:,}", f"{snap.rate:,.0f}", f"{snap.lag:,}")
    table.add_row("total", "", "", *totals, style="bold")
    return table


def _rows(snap: Snapshot) -> list[tuple[str, ...]]:
    halted = {halt.route.key: halt.offset for halt in snap.halted}
    if len(snap.rows) <= MAX_ROWS:
        return [
            (
                row.route.topic,
                str(row.route.partition),
                f"{row.route.target_topic}[{row.route.target_partition}]",
                f"{row.relayed:,}",
                f"{row.filtered:,}",
                f"{row.rate:,.0f}" if row.owned else "-",
                f"halted at {halted[row.route.key]}" if row.route.key in halted else _lag_cell(row),
            )
            for row in snap.rows
        ]
    by_topic: dict[str, list[PartitionRow]] = {}
    for row in snap.rows:
        by_topic.setdefault(row.route.topic, []).append(row)
    cells: list[tuple[str, ...]] = []
    for topic, rows in by_topic.items():
        owned = [row for row in rows if row.owned]
        cells.append(
            (
                topic,
                f"{len(owned)}/{len(rows)}",
                ", ".join(sorted({row.route.target_topic for row in rows})),
                f"{sum(row.relayed for row in rows):,}",
                f"{sum(row.filtered for row in rows):,}",
                f"{sum(row.rate for row in owned):,.0f}",
                f"{sum(row.lag or 0 for row in owned):,}",
            )
        )
    return cells


def _lag_cell(row: PartitionRow) -> str:
    if not row.owned:
        return "-"
    if row.waiting is not None:  # restore --follow: nothing to restore yet
        return "waiting: " + ("no segment yet" if row.waiting[0] == "empty" else "late segment")
    return "?" if row.lag is None else f"{row.lag:,}"


def plain_line(snap: Snapshot) -> str:
    line = (
        f"progress: relayed={snap.relayed} filtered={snap.filtered} rate={snap.rate:.0f}/s "
        f"lag={snap.lag} active={snap.active_node or '?'} "
        f"partitions={len(snap.owned)}/{len(snap.rows)} members={snap.members}"
    )
    if snap.remaining is not None:
        line += f" remaining={snap.remaining}"
        seconds = eta(snap)
        if seconds is not None or not snap.trouble:  # "eta=?" says nothing of why
            line += f" eta={_fmt_eta(seconds)}"
    waiting = sum(1 for row in snap.owned if row.waiting is not None)
    if waiting:
        line += f" waiting_for_segments={waiting}"
    if snap.lost:
        line += f" lost={snap.lost}"
    if snap.halted:
        line += f" halted={len(snap.halted)}"
    halts = [f"halted: {halt.where}" for halt in snap.halted]
    return "; ".join([line, *snap.trouble, *halts])


class Progress:
    """Shows progress until closed: live on a terminal console, else a log line per interval."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        console: Console | None,
        interval: float = 10.0,
        title: str = "relay",
    ):
        self._snapshot = snapshot
        self._title = title
        self._console = console
        self._interval = 1.0 if console is not None else interval
        self._stop = threading.Event()
        self._live: Live | None = None
        self._thread = threading.Thread(target=self._loop, name="ktm-progress", daemon=True)

    def __enter__(self) -> Progress:
        if self._console is not None:
            self._live = Live(console=self._console, auto_refresh=False, transient=False)
            self._live.start()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._live is not None:
            self._draw()
            self._live.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._draw()

    def _draw(self) -> None:
        try:
            snap = self._snapshot()
            if self._live is not None:
                self._live.update(render(snap, self._title), refresh=True)
            else:
                log.info("%s", plain_line(snap))
        except Exception as exc:  # noqa: BLE001 - a drawing problem must never stop the relay
            log.debug("progress: %s", exc)
