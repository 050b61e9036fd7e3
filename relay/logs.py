"""Logging set-up: only the CLI calls this. Library modules just use getLogger(__name__)."""

from __future__ import annotations

import json
import logging
import sys

_NOISY = ("kafka", "py4j", "pyspark")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str, *, debug: bool = False, fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else getattr(logging, level.upper()))
    # kafka-python logs every reconnect attempt at ERROR; ktm reports the outcome itself.
    for name in _NOISY:
        logging.getLogger(name).setLevel(logging.INFO if debug else logging.CRITICAL)
