"""Source topics deleted and created again under their name while relayed or backed up.

Their offsets start over: the copy holds offsets the new topic will reuse. A new topic with
fewer records than were copied is found by the next fetch (relay.losses: truncated); one that
already holds more is not, so the topics' IDs (KIP-516) are read at each health-check interval
and compared with the first ones seen on that node (each cluster of a failover pool has IDs of
its own). The runner halts the partitions of a topic whose ID changed. Looked at from the
runner's thread only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from relay.clients.kept import ClientCache
from relay.clients.topic_ids import topic_ids
from relay.config import ClusterConfig

log = logging.getLogger(__name__)

Reader = Callable[[ClusterConfig, Iterable[str], float], dict[str, str]]


class RecreatedTopics:
    def __init__(
        self,
        interval: float,
        timeout: float,
        read: Reader = topic_ids,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.interval, self.timeout, self.read, self.clock = interval, timeout, read, clock
        self._ids: dict[str, dict[str, str]] = {}  # node: topic: the first ID seen
        self._reported: set[str] = set()
        self._next = 0.0
        # one admin client kept between looks: a new one costs a bootstrap (3-4 round trips)
        self._clients = ClientCache()

    def check(self, node: ClusterConfig, topics: Iterable[str]) -> list[tuple[str, str]]:
        """Topics whose ID on `node` changed since first seen, each once, with the line saying
        it; at most one look per interval (a look is one Metadata request)."""
        now = self.clock()
        if now < self._next:
            return []
        self._next = now + self.interval
        try:
            with self._clients.use():
                ids = self.read(node, topics, self.timeout)
        except Exception as exc:  # noqa: BLE001 - looked at again at the next interval
            log.debug("source topic IDs not read from %s: %s", node.name, exc)
            return []
        seen = self._ids.setdefault(node.name, {})
        found = []
        for topic, ident in sorted(ids.items()):
            first = seen.setdefault(topic, ident)
            if first != ident and topic not in self._reported:
                self._reported.add(topic)
                found.append((topic, _line(topic, node.name, first, ident)))
        return found

    def close(self) -> None:
        self._clients.close()


def _line(topic: str, node: str, old: str, new: str) -> str:
    return (
        f"source topic {topic} on {node} was deleted and created again: its topic ID was {old}, "
        f"now {new}; its offsets start over, so its partitions halt where they were copied up "
        "to (copying the new topic into the same destination would repeat offsets the copy "
        "holds)"
    )
