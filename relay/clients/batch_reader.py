"""Executor-side reading of a task's source partitions as record batches (the batch path).

The same interface as `SourceReader` (assign, poll, positions, highwater, pause, commits), but a
poll returns each partition's whole record batches as bytes (`relay.batches.SourceBatch`), never
a Python object per record. Fetches go through `BatchFetcher` and its own network client (a
client polled from two threads fails: kafka-python's consumer may poll its own from a heartbeat
thread); the consumer never fetches: it is there for the source group's commits.

Fetches are pipelined: a poll puts a fetch on the wire to every leader that has none out,
waits at most its timeout for answers, and as soon as a partition's answer is handed over the
next fetch from its new position is sent, so it travels while the task writes what came. A
fetch slower than a poll stays out and is collected by a later poll: a long link or a slow
broker is waited for, never abandoned at every tick. Fetches that fail or time out are counted
per broker (`trouble`), for the driver to log and show.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from kafka import TopicPartition
from kafka import errors as kafka_errors

from relay import internals
from relay.batches import SourceBatch, drop_aborted, split_batches
from relay.clients.batch_fetch import Answer, BatchFetcher
from relay.clients.consumer import TP, SourceReader
from relay.clients.fetch_lanes import LANE_PARTITIONS
from relay.clients.seed import Seed
from relay.config import ClusterConfig, FetchConfig
from relay.losses import diverged, out_of_range
from relay.spec import FetchTrouble

log = logging.getLogger(__name__)

ASYNC_COMMIT_WAIT_MS = 300  # a commit in the loop: a dead source node stalls it this long at most
ERROR_PAUSE = 0.1  # seconds: a poll whose every partition failed waits this long (no spinning)
SLOW_FETCH = 2.0  # seconds a fetch may be out before the driver hears of it


@dataclass
class NodeTrouble:
    """Fetches from one broker that failed since the task last reported."""

    failures: int = 0
    error: str = ""  # the last one, "Type: message"


class BatchReader(SourceReader):
    def __init__(
        self,
        cluster: ClusterConfig,
        group_id: str,
        fetch: FetchConfig | None = None,
        warm: frozenset[str] = frozenset(),
        seed: Seed | None = None,
    ):
        """`warm`: topics whose metadata and leader connections the fetcher readies (`warm`)
        while the consumer bootstraps: side by side, not one after the other (each costs two
        round trips or more, half a second across a 240 ms link). `seed`: the driver's
        metadata of the cluster, which spares both their bootstrap (relay.clients.seed)."""
        fetch = fetch or FetchConfig()
        self._fetcher = _fetcher(cluster, fetch, seed)  # no round trip until its first request
        warming = threading.Thread(
            target=self._fetcher.warm, args=(warm, fetch.timeout), name="ktm-warm", daemon=True
        )
        if warm:
            warming.start()
        try:
            super().__init__(cluster, group_id, fetch.timeout, seed)
        except BaseException:
            if warm:
                warming.join()
            self._fetcher.close()
            raise
        if warm:
            self._find_coordinator(fetch.timeout)  # on the consumer's IO thread
            warming.join()
        self._positions: dict[TP, int] = {}
        self._epochs: dict[TP, int] = {}  # the leader epoch of the last batch read
        self._paused: set[TP] = set()
        self._highwater: dict[TP, int] = {}
        self.trouble: dict[str, NodeTrouble] = {}

    def _find_coordinator(self, timeout: float) -> None:
        """The source group's coordinator found and connected while the warm-up and the
        group's join go on: a task's last commit then waits one round trip, not three (0.5 s
        across a 240 ms link). Best effort: a commit that meets trouble says so itself."""
        try:
            internals.find_coordinator_soon(self._consumer, timeout)
        except internals.Missing as exc:
            log.debug("finding the source group's coordinator: %s", exc)

    def assign(self, starts: Mapping[TP, int]) -> None:
        """Read exactly these partitions, each from its start offset. A fetch still out from
        an earlier assignment is answered for positions nobody wants any more: dropped."""
        self._fetcher.abandon()
        self._tps = {key: TopicPartition(*key) for key in starts}
        self._positions = dict(starts)
        self._epochs = {}
        self._paused = set()
        self._highwater = {}
        self.losses = []

    def poll(self, timeout: float) -> dict[TP, list[SourceBatch]]:
        """The whole batches fetched for each partition that got an answer within `timeout`
        (the first may begin before the partition's position: a fetch starts at the batch
        holding it), less those of aborted transactions under read_committed (the list may be
        empty then). A partition's position moves past the batches fetched, so the next fetch
        goes on after them; it is on the wire already when this returns."""
        if len(self._paused) == len(self._positions):
            return {}
        answers = [] if self._fetcher.busy() else self._fetcher.send(self._wanted(), self._epochs)
        answers += self._fetcher.receive(timeout)
        found: dict[TP, list[SourceBatch]] = {}
        failed: dict[str, BaseException] = {}  # broker: the error of its failed fetch
        for answer in answers:
            key = answer.key
            if key in self._paused or answer.offset != self._positions.get(key):
                continue  # asked for a position that has moved since, or a paused partition
            if answer.fetched.error is not None:
                if self._on_error(answer):
                    failed[answer.node] = answer.fetched.error
                continue
            batches = self._take(answer)
            if batches is not None:
                found[key] = batches
        if answers:  # the next fetch travels while these are written
            self._fetcher.send(self._wanted(), self._epochs)
        for node, error in failed.items():
            trouble = self.trouble.setdefault(node, NodeTrouble())
            trouble.failures += 1
            trouble.error = f"{type(error).__name__}: {error}"
        if failed and not found:
            time.sleep(min(timeout, ERROR_PAUSE))
        return found

    def _take(self, answer: Answer) -> list[SourceBatch] | None:
        """The batches of a partition's answer, its position moved past them; None when the
        answer holds no whole batch, or the leader's log diverged (a loss, kept for the task)."""
        key = answer.key
        loss = diverged(key, answer.offset, answer.fetched.diverged)
        if loss is not None:  # the position stays: the task halts the partition there
            self.losses.append(loss)
            return None
        self._highwater[key] = answer.fetched.end
        batches, _ = split_batches(answer.fetched.data)
        if not batches:
            return None
        self._epochs[key] = batches[-1].header.leader_epoch
        # past every whole batch, an aborted transaction's too; the batches of those are
        # dropped (read_committed) and may leave none: the partition still moves
        self._positions[key] = max(self._positions[key], batches[-1].next_offset)
        return drop_aborted(batches, answer.fetched.aborted)

    def _wanted(self) -> dict[TP, int]:
        return {k: o for k, o in self._positions.items() if k not in self._paused}

    def _on_error(self, answer: Answer) -> bool:
        """Retriable errors (a leader moving, a node down, a fetch timed out) are retried by
        the next poll, and counted (True); the driver's health checks decide about a node that
        stays down. A position out of the log's range (retention deleted records not yet read,
        or the log was truncated below it) is a loss (relay.losses): kept for the task to take,
        and reading goes on at the log start or end; any other error fails the task."""
        key, error = answer.key, answer.fetched.error
        if isinstance(error, kafka_errors.OffsetOutOfRangeError):
            tp = self._tps[key]
            begin = self._consumer.beginning_offsets([tp])[tp]
            end = self._consumer.end_offsets([tp])[tp]
            loss = out_of_range(key, self._positions[key], begin, end)
            if loss is not None:
                self.losses.append(loss)
                self._positions[key] = loss.resume
                self._epochs.pop(key, None)  # no batch read before the new position yet
                return False
        if error is not None and not getattr(error, "retriable", False):
            raise error
        return True

    def take_trouble(self) -> list[FetchTrouble]:
        """Brokers whose fetches failed since the last call, or that a fetch has been out to
        for a while; the counts start over."""
        now = time.monotonic()
        waiting = {node: now - since for node, since in self._fetcher.waiting_on().items()}
        slow = {node for node, seconds in waiting.items() if seconds >= SLOW_FETCH}
        found = [
            FetchTrouble(node, t.failures, t.error, round(waiting.get(node, 0.0), 1))
            for node, t in sorted(self.trouble.items())
        ]
        found += [
            FetchTrouble(node, 0, "", round(waiting[node], 1))
            for node in sorted(slow - set(self.trouble))
        ]
        self.trouble = {}
        return found

    def commit_async(self, offsets: Mapping[TP, int], done: Callable[[], None]) -> None:
        """Committed at once, waiting at most `ASYNC_COMMIT_WAIT_MS`: nothing polls the consumer's
        client between commits here, so an asynchronous commit would never be answered (and
        polling that client from this thread races the one kafka-python may run)."""
        if offsets:
            self._consumer.commit(self._offsets(offsets), timeout_ms=ASYNC_COMMIT_WAIT_MS)
            done()

    def positions(self, keys: Iterable[TP]) -> dict[TP, int]:
        return {key: self._positions[key] for key in keys}

    def highwater(self, key: TP) -> int | None:
        """The end its last fetch reported: the last stable offset under read_committed (an
        open transaction's records are not lag: they are not to be read yet)."""
        return self._highwater.get(key)

    def pause(self, key: TP) -> None:
        self._paused.add(key)

    def close(self) -> None:
        self._fetcher.close()
        super().close()


def _fetcher(cluster: ClusterConfig, fetch: FetchConfig, seed: Seed | None) -> BatchFetcher:
    """The reader's fetcher, as `fetch` configures it."""
    # A fetch waits until min_bytes are there or max_wait is over: at low rates a few fetches a
    # second carry many records each (a fetch, rebuild and produce costs about the same for one
    # record as for a hundred); at high rates it fills at once.
    return BatchFetcher(
        cluster,
        fetch.timeout,
        max_wait=fetch.max_wait,
        min_bytes=fetch.min_bytes,
        partition_max_bytes=fetch.partition_max_bytes,
        max_bytes=fetch.max_bytes,
        sessions=True,
        lanes=fetch.in_flight,
        lane_partitions=LANE_PARTITIONS,
        idle_wait=fetch.idle_wait,
        seed=seed,
    )
