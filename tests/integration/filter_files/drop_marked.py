"""Test filter: drop records whose value starts with a marker; relay all others.

Config keys: id (default "drop_marked"), marker (str, default "drop"). Needs no config, so it
also works as a `--filter PATH` filter, which gets an empty config.
"""

from typing import Any

KNOWN_KEYS = ("id", "marker")


class DropMarked:
    def __init__(self, filter_id: str, marker: bytes) -> None:
        self.id = filter_id
        self.marker = marker

    def is_allowed(self, record: Any) -> bool:
        return not (record.value or b"").startswith(self.marker)


def new(config: dict[str, Any]) -> DropMarked:
    unknown = sorted(set(config) - set(KNOWN_KEYS))
    if unknown:
        raise ValueError(f"unknown config keys {unknown}")
    return DropMarked(config.get("id", "drop_marked"), config.get("marker", "drop").encode())
