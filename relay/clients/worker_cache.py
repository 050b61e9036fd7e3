"""Kafka clients cached per Spark worker process and reused from one round to the next (any
worker is as warm as another: the clients hold connections and metadata, not partition state).

One reader per worker at a time (after a failover the old node's is closed), one producer per
target. `close_clients` closes them before Spark stops: PySpark ends workers with os._exit, so
atexit hooks never run there. A client that cannot be opened raises what its library raised;
the task's sides say which side failed (relay.engine.executor.failures).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from relay.clients.batch_reader import BatchReader
from relay.clients.consumer import SourceReader
from relay.clients.producer import Producer
from relay.clients.seed import Seed
from relay.config import ClusterConfig, FetchConfig, TargetConfig

log = logging.getLogger(__name__)

# (source, group, batch path, fetch settings): one reader per worker process at a time
_readers: dict[tuple[ClusterConfig, str, bool, FetchConfig], SourceReader] = {}
_producers: dict[TargetConfig, Producer] = {}


def source_reader(
    source: ClusterConfig,
    group_id: str,
    batches: bool = False,
    fetch: FetchConfig | None = None,
    warm: frozenset[str] = frozenset(),
    seed: Seed | None = None,
) -> SourceReader:
    """The worker's cached reader: of record batches (the batch path) or of records; a new
    reader of batches readies the fetches of the `warm` topics as it opens; a new one is told
    the driver's metadata of the cluster (`seed`, relay.clients.seed)."""
    fetch = fetch or FetchConfig()
    key = (source, group_id, batches, fetch)
    for other in [k for k in _readers if k != key]:
        # After a failover the old node's client is closed, not left reconnecting forever
        # (and, on brokers that auto-create topics, re-creating them when the node returns).
        _close_quietly(_readers.pop(other).close)
    if key not in _readers:
        if batches:
            _readers[key] = BatchReader(source, group_id, fetch, warm, seed)
        else:
            _readers[key] = SourceReader(source, group_id, fetch.timeout, seed)
    return _readers[key]


def open_at_once(*opens: Callable[[], object]) -> None:
    """Open clients of different clusters side by side: each bootstrap is a few round trips,
    and across a long link one after another they add up to seconds. Errors are left for the
    task to meet when it opens the client itself."""
    threads = [threading.Thread(target=_quietly, args=(o,), daemon=True) for o in opens]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _quietly(open_client: Callable[[], object]) -> None:
    try:
        open_client()
    except Exception as exc:  # noqa: BLE001 - a warm-up: the task opens it again and reports
        log.debug("warming a client: %s", exc)


def warm_reader(
    source: ClusterConfig,
    group_id: str,
    fetch: FetchConfig,
    topics: frozenset[str],
    seed: Seed | None = None,
) -> None:
    """The worker's cached batch reader, opened with metadata and leader connections for
    `topics` (one cached already is warm from its earlier rounds)."""
    source_reader(source, group_id, True, fetch, topics, seed)


def evict_reader(source: ClusterConfig, group_id: str, kind: str) -> None:
    """A fresh consumer after a failed round (about 0.1 s, only after an error). A cached one
    that was mid-fetch when its task failed on the destination was seen to return nothing
    more in the next round (both tasks idle in KafkaConsumer.poll, lag left, the target frozen
    a moment before: tests/integration/test_destination_faults.py)."""
    if kind in ("source", "internal", "target"):
        for key in [k for k in _readers if k[:2] == (source, group_id)]:
            _close_quietly(_readers.pop(key).close)


def producer(target: TargetConfig) -> Producer:
    """The worker's cached producer for `target`, made on first use."""
    if target not in _producers:
        _producers[target] = Producer(target)
    return _producers[target]


def cached_producer(target: TargetConfig) -> Producer | None:
    return _producers.get(target)


def abandon_producer(target: TargetConfig, waiting: Callable[[], object] | None = None) -> None:
    """Drop the cached producer without sending what it still holds (Producer.abandon: what it
    sent is waited for, `waiting` called meanwhile)."""
    dropped = _producers.pop(target, None)
    if dropped is not None:
        _close_quietly(dropped.abandon, waiting)


def close_clients(_: object = None) -> int:
    """Close every cached client of this worker process; safe to call twice. The driver runs
    it on every worker before it stops Spark: PySpark ends workers with os._exit, so atexit
    hooks never run there. Returns this worker's pid."""
    while _producers:
        _close_quietly(_producers.popitem()[1].close, 5.0)
    while _readers:
        _close_quietly(_readers.popitem()[1].close)
    return os.getpid()


def _close_quietly(close: Callable[..., object], *args: object) -> None:
    try:
        close(*args)
    except Exception:  # noqa: BLE001 - a broken client is being thrown away anyway
        pass
