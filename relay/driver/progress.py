"""Live progress: a rich table on a terminal, plain log lines at a steady rate otherwise.

It only reads `Status.snapshot()`, on its own thread, so drawing never slows the relay.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from relay.driver.status import Snapshot

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


def render(snap: Snapshot) -> Group:
    """The terminal view: one row per source partition, totals, and a bar for --stop-at-end."""
    table = Table(title=f"ktm relay - active node: {snap.active_node or '?'}", expand=False)
    for name, justify in (
        ("source", "left"),
        ("partition", "right"),
        ("target", "left"),
        ("relayed", "right"),
        ("filtered", "right"),
        ("rate/s", "right"),
        ("lag", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in snap.rows:
        r = row.route
        table.add_row(
            r.topic,
            str(r.partition),
            f"{r.target_topic}[{r.target_partition}]",
            f"{row.relayed:,}",
            f"{row.filtered:,}",
            f"{row.rate:,.0f}",
            "?" if row.lag is None else f"{row.lag:,}",
        )
    table.add_row(
        "total",
        "",
        "",
        f"{snap.relayed:,}",
        f"{snap.filtered:,}",
        f"{snap.rate:,.0f}",
        f"{snap.lag:,}",
        style="bold",
    )
    parts: list[Table | Text | ProgressBar] = [table]
    if snap.remaining is not None:
        done = snap.relayed + snap.filtered
        total = done + snap.remaining
        parts.append(ProgressBar(total=max(total, 1), completed=done, width=60))
        parts.append(
            Text(f"{done:,} / {total:,} records to the end offsets, ETA {_fmt_eta(eta(snap))}")
        )
    return Group(*parts)


def plain_line(snap: Snapshot) -> str:
    line = (
        f"progress: relayed={snap.relayed} filtered={snap.filtered} rate={snap.rate:.0f}/s "
        f"lag={snap.lag} active={snap.active_node or '?'}"
    )
    if snap.remaining is not None:
        line += f" remaining={snap.remaining} eta={_fmt_eta(eta(snap))}"
    return line


class Progress:
    """Shows progress until closed: live on a terminal console, else a log line per interval."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        console: Console | None,
        interval: float = 10.0,
    ):
        self._snapshot = snapshot
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
                self._live.update(render(snap), refresh=True)
            else:
                log.info("%s", plain_line(snap))
        except Exception as exc:  # noqa: BLE001 - a drawing problem must never stop the relay
            log.debug("progress: %s", exc)
