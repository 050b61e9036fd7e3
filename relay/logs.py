"""Logging set-up: only the CLI calls this. Library modules just use getLogger(__name__)."""

from __future__ import annotations

import json
import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich is imported only when a console is given
    from rich.console import Console

_NOISY = ("kafka", "py4j", "pyspark")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            # milliseconds: a round, a failover or a stop takes less than a second
            "ts": f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')}.{int(record.msecs):03d}",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def _ours_or_warning(record: logging.LogRecord) -> bool:
    """ktm's own lines at the configured level; libraries only from WARNING up. Nothing from
    the root logger: ktm never logs there, and py4j does, with a traceback at INFO or ERROR,
    whenever Spark's JVM goes away under a call; ktm reports that failure itself."""
    if record.name.startswith("relay"):
        return True
    return record.name != "root" and record.levelno >= logging.WARNING


def setup_logging(
    level: str, *, debug: bool = False, fmt: str = "text", console: Console | None = None
) -> None:
    """Log to stderr; with a rich `console` (live progress on), through it, so log lines and
    the live table do not overwrite each other."""
    handler: logging.Handler
    if console is not None:
        from rich.logging import RichHandler

        handler = RichHandler(console=console, show_path=False, log_time_format="%H:%M:%S")
    else:
        handler = logging.StreamHandler(sys.stderr)
        text = logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
        handler.setFormatter(JsonFormatter() if fmt == "json" else text)
    if not debug:
        handler.addFilter(_ours_or_warning)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else getattr(logging, level.upper()))
    # kafka-python logs every reconnect attempt at ERROR; ktm reports the outcome itself. Never
    # DEBUG for it, not even with --debug: its clients log their whole config there, passwords
    # included (tests/unit/test_security.py guards this).
    for name in _NOISY:
        logging.getLogger(name).setLevel(logging.INFO if debug else logging.CRITICAL)
