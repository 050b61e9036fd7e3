"""Test filter: raise on the record at one partition and offset; allow every other record.

Config keys: id (default "fail_on"), partition (int), offset (int), all but id required.
"""

from typing import Any


class FailOn:
    def __init__(self, filter_id: str, partition: int, offset: int) -> None:
        self.id = filter_id
        self.position = (partition, offset)

    def is_allowed(self, record: Any) -> bool:
        if (record.partition, record.offset) == self.position:
            raise RuntimeError(f"cannot judge the record at offset {record.offset}")
        return True


def new(config: dict[str, Any]) -> FailOn:
    return FailOn(config.get("id", "fail_on"), int(config["partition"]), int(config["offset"]))
