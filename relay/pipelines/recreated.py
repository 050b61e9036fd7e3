"""Source topics deleted and created again under their name while relayed or backed up.

Their offsets start over: the copy holds offsets the new topic will reuse. A new topic with
fewer records than were copied is found by the next fetch (relay.losses: truncated); one that
already holds more is not, so the topics' IDs (KIP-516) are read at each health-check interval
and compared with the first ones seen on that node (each cluster of a failover pool has IDs of
its own). The runner halts the partitions of a topic whose ID changed. A look is a Metadata
answer of every partition of the topics: beyond a few thousand partitions the looks are spaced
further apart (relay.pipelines.spacing: at 10,000 partitions every 5 intervals). A look runs on a
thread of its own, one at a time: a source that does not answer must not hold the runner's loop
(and a stop asked meanwhile) for a request timeout; what a look found is returned by the first
`check` after it ended.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from relay.clients.kept import ClientCache
from relay.clients.topic_ids import topic_ids
from relay.config import ClusterConfig
from relay.pipelines.spacing import spaced

log = logging.getLogger(__name__)

Reader = Callable[[ClusterConfig, Iterable[str], float], dict[str, str]]
Spawn = Callable[[Callable[[], None]], "threading.Thread | None"]


def on_a_thread(look: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=look, name="ktm-topic-ids", daemon=True)
    thread.start()
    return thread


class RecreatedTopics:
    def __init__(
        self,
        interval: float,
        timeout: float,
        read: Reader = topic_ids,
        clock: Callable[[], float] = time.monotonic,
        spawn: Spawn = on_a_thread,
    ):
        self.interval, self.timeout, self.read, self.clock = interval, timeout, read, clock
        self._spawn = spawn
        self._ids: dict[str, dict[str, str]] = {}  # node: topic: the ID last seen
        self._next = 0.0
        self.started = 0  # looks started, numbered from 1
        self.done = 0  # the number of the latest look that ended with an answer
        self._look: threading.Thread | None = None
        self._lock = threading.Lock()
        # node: topic: the line, found by looks and not yet returned
        self._found: dict[str, dict[str, str]] = {}
        # one admin client kept between looks: a new one costs a bootstrap (3-4 round trips)
        self._clients = ClientCache()
        self._looking = False  # a look is under way (under _lock)
        self._closed = False  # close() came: the look under way closes the client (under _lock)

    def check(
        self, node: ClusterConfig, topics: Iterable[str], partitions: int = 0
    ) -> list[tuple[str, str]]:
        """Topics whose ID on `node` changed since last seen, each change once, with the line
        saying it, as far as the looks that ended know; starts a look (one Metadata request) at most
        once per interval (`spaced` for its `partitions`), never while one is under way, and
        never waits for it. `topics` is read only when a look starts."""
        now = self.clock()
        if now >= self._next and (self._look is None or not self._look.is_alive()):
            self._next = now + spaced(self.interval, partitions)
            wanted, self.started = sorted(set(topics)), self.started + 1
            number = self.started
            with self._lock:
                self._looking = True
            self._look = self._spawn(lambda: self._look_once(node, wanted, number))
        # only what the node relayed from now found: a look started before a failover may end
        # after it, and a recreated topic on a node ktm left must halt nothing
        with self._lock:
            return sorted(self._found.pop(node.name, {}).items())

    def look_soon(self) -> int:
        """The next `check` starts a look, unless one is under way; the number the next look
        will have (it ended once `done` reaches it)."""
        self._next = 0.0
        return self.started + 1

    def _look_once(self, node: ClusterConfig, topics: list[str], number: int) -> None:
        try:
            self._look_at(node, topics, number)
        finally:
            with self._lock:
                self._looking, closed = False, self._closed
            if closed:
                self._clients.close()

    def _look_at(self, node: ClusterConfig, topics: list[str], number: int) -> None:
        try:
            with self._clients.use():
                ids = self.read(node, topics, self.timeout)
        except Exception as exc:  # noqa: BLE001 - looked at again at the next interval
            log.debug("source topic IDs not read from %s: %s", node.name, exc)
            return
        seen = self._ids.setdefault(node.name, {})
        for topic, ident in sorted(ids.items()):
            first, seen[topic] = seen.get(topic, ident), ident
            if first != ident:
                with self._lock:
                    self._found.setdefault(node.name, {})[topic] = _line(
                        topic, node.name, first, ident
                    )
        with self._lock:
            self.done = max(self.done, number)

    def close(self) -> None:
        """Not waiting for a look under way (across a long link its first answer takes a
        bootstrap, ~1 s at 240 ms, which held up stops): that look closes the client when it
        ends; closing it under the look would break kafka-python (not thread-safe)."""
        with self._lock:
            self._closed, looking = True, self._looking
        if not looking:
            self._clients.close()


def _line(topic: str, node: str, old: str, new: str) -> str:
    return (
        f"source topic {topic} on {node} was deleted and created again: its topic ID was {old}, "
        f"now {new}; its offsets start over"
    )
