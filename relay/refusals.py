"""Records a destination topic refuses for good, whatever the retry: what its configs say, and
which record of a refused batch was the first one they refuse.

Apache Kafka refuses a whole produce batch when one of its records is out of line (LogValidator):

- a CreateTime timestamp more than `message.timestamp.before.max.ms` before the broker's clock or
  more than `message.timestamp.after.max.ms` after it (KIP-937; 4.x sets after.max to one hour by
  default; 3.x also has `message.timestamp.difference.max.ms`, both ways): INVALID_TIMESTAMP;
- a record without a key sent to a `cleanup.policy=compact` topic: INVALID_RECORD.

The broker names the refused records by their index in the batch (ProduceResponse v8+,
`record_errors`); where it does not, the rules read here at start-up from the destination
topic's configs (DescribeConfigs) find the first one. Pure: no Kafka client.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

BEFORE_MAX = "message.timestamp.before.max.ms"
AFTER_MAX = "message.timestamp.after.max.ms"
DIFFERENCE_MAX = "message.timestamp.difference.max.ms"  # 3.x, removed in 4.0
NO_LIMIT = (1 << 63) - 1  # Long.MAX_VALUE: what Kafka describes for "no limit"


@dataclass(frozen=True)
class TopicRules:
    """What one destination topic refuses, as its configs say (None: no such limit)."""

    topic: str
    before_max_ms: int | None = None
    after_max_ms: int | None = None
    difference_max_ms: int | None = None
    compacted: bool = False
    log_append_time: bool = False  # the broker stamps its own time: no timestamp is refused

    def refuses(self, timestamp: int, key: bytes | None, now_ms: int) -> str | None:
        """Which config refuses a record with this timestamp and key, said with its value and
        the record's side of it; None if none does."""
        if key is None and self.compacted:
            where = f"on destination topic {self.topic}"
            return f"cleanup.policy=compact {where} (the record has a null key)"
        if self.log_append_time or timestamp < 0:  # -1: no timestamp, never checked
            return None
        for name, limit, late in self._limits():
            beyond = now_ms - timestamp if late else timestamp - now_ms
            if limit is not None and beyond > limit:
                when = _when(timestamp, now_ms)
                return f"{name} = {limit} on destination topic {self.topic} ({when})"
        return None

    def _limits(self) -> list[tuple[str, int | None, bool]]:
        return [
            (BEFORE_MAX, self.before_max_ms, True),
            (AFTER_MAX, self.after_max_ms, False),
            (DIFFERENCE_MAX, self.difference_max_ms, True),
            (DIFFERENCE_MAX, self.difference_max_ms, False),
        ]

    def limits_text(self) -> str:
        """The limits this topic has, for a message when no record could be singled out."""
        parts = [f"{name} = {limit}" for name, limit, late in self._limits()[:3] if limit]
        if self.compacted:
            parts.append("cleanup.policy=compact")
        return ", ".join(parts) or "no limit ktm could read"


def rules_of(topic: str, configs: Mapping[str, str]) -> TopicRules:
    """A topic's rules from its described configs (every config, defaults included)."""
    return TopicRules(
        topic,
        _limit(configs.get(BEFORE_MAX)),
        _limit(configs.get(AFTER_MAX)),
        _limit(configs.get(DIFFERENCE_MAX)),
        "compact" in configs.get("cleanup.policy", "").split(","),
        configs.get("message.timestamp.type", "") == "LogAppendTime",
    )


def _limit(value: str | None) -> int | None:
    if value is None or not value.strip().lstrip("-").isdigit():
        return None
    number = int(value)
    return None if number < 0 or number >= NO_LIMIT else number


def _when(timestamp: int, now_ms: int) -> str:
    """A record's timestamp as the operator reads it: ms, UTC time and how far from now."""
    try:
        moment = datetime.fromtimestamp(timestamp / 1000, UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        moment = "out of range"
    ahead = (timestamp - now_ms) / 3_600_000
    side = f"{ahead:.1f}h ahead of now" if ahead >= 0 else f"{-ahead:.1f}h before now"
    return f"record timestamp {timestamp} = {moment.replace('+00:00', 'Z')}, {side}"


@dataclass(frozen=True)
class Refusal:
    """The first record of a refused batch the destination refuses, and why."""

    offset: int  # its source offset
    reason: str  # the broker config (or rule) and the record's side of it


class SentRecord(Protocol):
    """What `first_refused` reads of a record: a decoded source record or its stand-in."""

    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...


def first_refused(
    records: Iterable[SentRecord], rules: TopicRules | None, now_ms: int, named: int | None = None
) -> Refusal | None:
    """The first record (each with `offset`, `timestamp`, `key`) of a refused batch that the
    destination refuses: the one the broker named (`named`: its index in the batch), else the
    first one `rules` refuse; None when neither says."""
    listed = list(records)
    if named is not None and 0 <= named < len(listed):
        record = listed[named]
        reason = rules.refuses(record.timestamp, record.key, now_ms) if rules else None
        return Refusal(record.offset, reason or "")
    if rules is None:
        return None
    for record in listed:
        reason = rules.refuses(record.timestamp, record.key, now_ms)
        if reason is not None:
            return Refusal(record.offset, reason)
    return None


Rules = tuple[TopicRules, ...]  # what the task spec carries: one per destination topic


def rules_for(rules: Rules, topic: str) -> TopicRules | None:
    return next((r for r in rules if r.topic == topic), None)
