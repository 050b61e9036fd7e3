"""What `ktm verify` compares: the copy's destination partitions, and for each the source
partitions that feed it, with the range of each to check. Three kinds of copy:

- a relay (the default): the relay's own routes, read as `ktm check` reads them (no topic
  created, no group joined), so renames, `dest:N` fan-in and [discover] patterns verify as
  they relay; in failover mode the active node is the source;
- a backup (`--store`): each `[topics]` key's partitions on the source against their segments;
- a restore (`--from-store`): each `[topics]` route's destination against the store.

The range of a Kafka source partition is its log start up to its end offset read now; of a
stored one, everything up to the store's next offset.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from relay.clients import admin
from relay.clients.settings import describe
from relay.config import ClusterConfig, Config, StoreConfig
from relay.engine.metrics import Metrics
from relay.errors import ConfigError, KafkaSetupError
from relay.filters import FilterSpec, load_filters
from relay.pipelines.routes import plan_routes
from relay.pipelines.source_pool import first_answering
from relay.pipelines.verify.spec import OPEN, DestWork, Feeder, Scope
from relay.spec import PartitionRoute

if TYPE_CHECKING:  # pyarrow is imported only where a store is read
    from relay.store import SegmentStore

Selection = dict[str, set[int] | None]  # topic -> partitions (None: all of them)
KINDS = ("relay", "backup", "restore")


@dataclass(frozen=True)
class VerifyPlan:
    kind: str  # one of KINDS
    source: ClusterConfig | StoreConfig
    target: ClusterConfig | StoreConfig
    works: tuple[DestWork, ...]
    filters: tuple[FilterSpec, ...]
    clusters: tuple[str, ...]  # the names the copy's provenance gives its source
    scope: Scope = Scope()


def plan_verify(
    cfg: Config,
    kind: str,
    failover: bool,
    selection: Selection | None,
    scope: Scope | None = None,
    follow: bool = False,
) -> VerifyPlan:
    """The plan of one check; `follow`: of a running copy, every range open at its end."""
    scope = scope or Scope()
    if kind == "backup":
        plan = _backup(cfg, failover, selection, scope)
    elif kind == "restore":
        plan = _restore(cfg, selection, scope)
    else:
        plan = _relay(cfg, failover, selection, scope)
    return replace(plan, works=tuple(_opened(w) for w in plan.works)) if follow else plan


def _opened(work: DestWork) -> DestWork:
    feeders = tuple(replace(f, end=OPEN) for f in work.feeders)
    return replace(work, end=OPEN, feeders=feeders)


def _relay(cfg: Config, failover: bool, selection: Selection | None, scope: Scope) -> VerifyPlan:
    from relay.pipelines.relay.driver import RelayPipeline

    filters = load_filters(cfg)
    relay = RelayPipeline(
        cfg,
        stop_event=threading.Event(),
        metrics=Metrics(),
        failover=failover,
        dry_run=True,
        filters=filters,
    )
    try:
        # a relay's start-up lines
        with _quiet("relay.provenance.resume", "relay.pipelines.source_plan"):
            found = relay.partitions().routes
            assert found is not None  # a relay never waits for its partitions
            routes = relay.resume(found, False).routes
        source = relay.source_node
    finally:
        relay.close()
    target = cfg.need_target().cluster
    works = _kafka_works(source, target, select(routes, selection), _timeout(cfg))
    clusters = tuple(node.name for node in cfg.sources)
    return VerifyPlan("relay", source, target, works, filters, clusters, scope)


def _backup(cfg: Config, failover: bool, selection: Selection | None, scope: Scope) -> VerifyPlan:
    store_cfg = cfg.need_store()
    store = _store(store_cfg)
    filters = load_filters(cfg)
    names = sorted({t.source for t in cfg.topics})
    source, counts = first_answering(cfg.sources if failover else cfg.sources[:1], _timeout(cfg))
    routes = [PartitionRoute(t, p, t, p) for t in names if t in counts for p in range(counts[t])]
    missing = [t for t in names if t not in counts]
    if missing:
        raise KafkaSetupError(f"source topic {missing[0]!r} does not exist on {describe(source)}")
    routes = select(routes, selection)
    for topic in sorted({r.topic for r in routes}):
        if not store.list_partitions(store_cfg.cluster, topic):
            raise ConfigError(
                f"[store].url: {store.describe()} holds no segment of {topic!r} "
                f"(cluster {store_cfg.cluster!r})"
            )
    begin, end = admin.offset_bounds(source, [r.key for r in routes], _timeout(cfg))
    works = tuple(
        DestWork(
            r.topic,
            r.partition,
            begin[r.key],
            end[r.key],
            (Feeder(r.key, begin[r.key], end[r.key]),),
        )
        for r in routes
    )
    return VerifyPlan("backup", source, store_cfg, works, filters, (store_cfg.cluster,), scope)


def _restore(cfg: Config, selection: Selection | None, scope: Scope) -> VerifyPlan:
    store_cfg, target = cfg.need_store(), cfg.need_target().cluster
    store = _store(store_cfg)
    stored = {t.source: store.partition_count(store_cfg.cluster, t.source) for t in cfg.topics}
    empty = [topic for topic, count in stored.items() if count == 0]
    if empty:
        raise ConfigError(
            f"[store].url: {store.describe()} holds no segment of {empty[0]!r} "
            f"(cluster {store_cfg.cluster!r})"
        )
    timeout = _timeout(cfg)
    counts = admin.partition_counts(target, [t.target for t in cfg.topics], timeout)
    routes = select(
        plan_routes(cfg.topics, stored, counts, store.describe(), describe(target)), selection
    )
    feeders: dict[tuple[str, int], list[Feeder]] = defaultdict(list)
    for r in routes:
        end = store.next_offset(store_cfg.cluster, r.topic, r.partition) or 0
        feeders[(r.target_topic, r.target_partition)].append(Feeder(r.key, 0, end))
    works = _dest_works(target, feeders, timeout)
    return VerifyPlan("restore", store_cfg, target, works, (), (store_cfg.cluster,), scope)


def _kafka_works(
    source: ClusterConfig, target: ClusterConfig, routes: list[PartitionRoute], timeout: float
) -> tuple[DestWork, ...]:
    src_begin, src_end = admin.offset_bounds(source, [r.key for r in routes], timeout)
    feeders: dict[tuple[str, int], list[Feeder]] = defaultdict(list)
    for r in routes:
        feeders[(r.target_topic, r.target_partition)].append(
            Feeder(r.key, src_begin[r.key], src_end[r.key], r.incarnation)
        )
    return _dest_works(target, feeders, timeout)


def _dest_works(
    target: ClusterConfig, feeders: dict[tuple[str, int], list[Feeder]], timeout: float
) -> tuple[DestWork, ...]:
    try:
        dst_begin, dst_end = admin.offset_bounds(target, sorted(feeders), timeout)
    except KafkaSetupError as exc:
        raise ConfigError(f"[target]: {exc}") from exc
    return tuple(
        DestWork(
            topic,
            partition,
            dst_begin[(topic, partition)],
            dst_end[(topic, partition)],
            tuple(sorted(fs, key=lambda f: f.key)),
        )
        for (topic, partition), fs in sorted(feeders.items())
    )


def _store(cfg: StoreConfig) -> SegmentStore:
    from relay.store.configured import store_of

    store = store_of(cfg)
    store.check(write=False)
    return store


@contextmanager
def _quiet(*names: str) -> Iterator[None]:
    """Those loggers at WARNING meanwhile: the relay's plan says where a relay would resume,
    which a verify does not."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _timeout(cfg: Config) -> float:
    return cfg.source_pool.request_timeout * 5 if cfg.sources else 30.0


def select(routes: list[PartitionRoute], selection: Selection | None) -> list[PartitionRoute]:
    """The routes `--partitions` names; one naming what the copy does not carry is an error."""
    if not selection:
        return routes
    known: dict[str, set[int]] = defaultdict(set)
    for r in routes:
        known[r.topic].add(r.partition)
    for topic, partitions in selection.items():
        if topic not in known:
            raise ConfigError(f"--partitions: the copy carries no topic {topic!r}")
        unknown = sorted((partitions or set()) - known[topic])
        if unknown:
            raise ConfigError(
                f"--partitions: {topic} has no partition {unknown[0]} "
                f"(it has {len(known[topic])}: 0..{max(known[topic])})"
            )
    return [r for r in routes if r.topic in selection and _picked(selection[r.topic], r.partition)]


def _picked(partitions: set[int] | None, partition: int) -> bool:
    return partitions is None or partition in partitions


def parse_partitions(values: Sequence[str]) -> Selection:
    """`topic` or `topic:0,1` (repeatable) -> the selection."""
    out: Selection = {}
    for value in values:
        topic, _, numbers = value.partition(":")
        if not topic:
            raise ConfigError(f"--partitions {value!r}: give topic or topic:0,1")
        if not numbers:
            out[topic] = None
            continue
        try:
            picked = {int(n) for n in numbers.split(",") if n.strip()}
        except ValueError:
            raise ConfigError(f"--partitions {value!r}: partitions are numbers") from None
        current = out.get(topic, set())
        out[topic] = None if current is None else current | picked
    return out
