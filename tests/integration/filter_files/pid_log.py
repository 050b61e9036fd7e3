"""Test filter: append "new <pid>" to a file when loaded, "first <pid>" on its first record.

Config keys: id (default "pid_log"), path (str, required): the file to append to. It allows
every record. One "new" line per process proves the filter is loaded once per process; the
"first" lines show which processes judged records.
"""

import os
from typing import Any


def _append(path: str, what: str) -> None:
    # One short write to a file opened for appending: lines from concurrent processes don't mix.
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"{what} {os.getpid()}\n")


class PidLog:
    def __init__(self, filter_id: str, path: str) -> None:
        self.id = filter_id
        self.path = path
        self.judged = False

    def is_allowed(self, record: Any) -> bool:
        if not self.judged:
            self.judged = True
            _append(self.path, "first")
        return True


def new(config: dict[str, Any]) -> PidLog:
    path = config["path"]
    _append(path, "new")
    return PidLog(config.get("id", "pid_log"), path)
