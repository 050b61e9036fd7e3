"""The relay's topics: which source topics it takes (`[topics]`, `[discover]` patterns), and
their destination topics, created or grown when `[target].create_topics` allows it.

At start every problem is an error (a missing destination names the key that would fix it).
While running, topics and partitions are looked for every `[discover].interval` (the topics of
`[topics]` too). A new topic that cannot be relayed yet (its destination is missing and ktm may
not create it, or too small) is logged once and looked at again at the next interval: nothing is
lost by waiting, it starts from the beginning (or where `[discover].start` says) once it can. A
topic already relayed that gained partitions its destination lacks and cannot get (ktm may not
grow it, or the broker refuses) is `short`: its new partitions halt (the driver), never remapped.

Brokers that do not implement an admin call (Tansu: DescribeConfigs answers nothing,
CreatePartitions is missing) get one log line and ktm goes on with what works.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from kafka.errors import InvalidPartitionsError

from relay.clients import admin, topic_create
from relay.clients.settings import describe, is_retriable
from relay.config import ClusterConfig, Config, TopicRoute
from relay.engine.metrics import Metrics
from relay.errors import KafkaSetupError
from relay.pipelines.relay.topic_configs import ConfigCopy
from relay.pipelines.routes import plan_routes
from relay.selection import select_routes
from relay.spec import PartitionRoute

log = logging.getLogger(__name__)

T = TypeVar("T")
GROWN_POLL = 0.1  # seconds between looks at a destination just grown
LOG_EACH_CREATED = 10  # more created topics than this: one line, each at debug


class Call(Protocol):
    """Calls.call (relay.pipelines.calls): retries, one clear error."""

    def __call__(self, side: str, fn: Callable[[], T], /) -> T: ...


@dataclass(frozen=True)
class Creation:
    topic: str
    partitions: int
    configs: tuple[tuple[str, str], ...]  # copied from the source topic
    source: str  # the source topic it copies


@dataclass(frozen=True)
class Short:
    """A new partition of a relayed topic whose destination partition does not exist."""

    route: PartitionRoute  # to the same partition number, which the destination lacks
    reason: str  # names the topic, both counts and the key that would allow growing it


@dataclass(frozen=True)
class Found:
    routes: list[PartitionRoute]  # new partitions that can be relayed now
    short: list[Short]  # new partitions of relayed topics that cannot be (halted)


@dataclass(frozen=True)
class TopicPlan:
    routes: tuple[TopicRoute, ...]  # the routes to relay now
    source_counts: dict[str, int]  # every source topic's partition count
    created: tuple[Creation, ...]  # destinations created (dry run: that would be)
    grown: tuple[tuple[str, int, int], ...]  # (destination, partitions, partitions wanted)
    held: tuple[TopicRoute, ...] = ()  # dry run: routes whose destination would be created


class Topics:
    def __init__(
        self,
        cfg: Config,
        source: Callable[[], ClusterConfig],
        call: Call,
        metrics: Metrics,
        timeout: float,
        source_counts: Callable[[float], dict[str, int]] | None = None,
    ):
        """`source`: the node to read configs from; `source_counts(timeout)`: every source
        topic's partition count (default: asked of `source`)."""
        self.cfg, self.metrics, self.timeout = cfg, metrics, timeout
        self.target = cfg.need_target()
        self._source, self._call = source, call
        self._counts = source_counts or (lambda t: admin.all_partition_counts(source(), t))
        self._said: set[str] = set()  # log lines already written once
        self._copy = ConfigCopy(self.target, timeout)

    def resolve(self, dry_run: bool = False) -> TopicPlan:
        """The routes and what their destinations need; with `dry_run`, nothing is created."""
        src = self._call("source", lambda: self._counts(self.timeout))
        routes = select_routes(self.cfg.topics, self.cfg.discover, src)
        dst = self._call(
            "target", lambda: admin.all_partition_counts(self.target.cluster, self.timeout)
        )
        wanted = needed_partitions(routes, src)
        missing = {d: n for d, n in wanted.items() if d not in dst}
        small = tuple((d, dst[d], n) for d, n in sorted(wanted.items()) if d in dst and dst[d] < n)
        if not self.target.create_topics:
            return TopicPlan(routes, src, (), ())
        creations = self._creations(missing, routes)
        if dry_run:
            held = tuple(r for r in routes if r.target in missing)
            kept = tuple(r for r in routes if r.target not in missing)
            return TopicPlan(kept, src, creations, small, held)
        self._create(creations)
        grown = self._grow(small)
        return TopicPlan(routes, src, creations, grown)

    def new_partitions(self, known: set[tuple[str, int]]) -> Found:
        """Partitions of the source not in `known` that can be relayed now (their destination
        exists, created or grown first where allowed), and those of relayed topics whose
        destination lacks them; the new topics that must wait are logged once."""
        plan = self.resolve()
        found = Found([], [])
        dst = admin.partition_counts(
            self.target.cluster, {r.target for r in plan.routes}, self.timeout
        )
        src = describe(self._source())
        for route in plan.routes:
            count = plan.source_counts.get(route.source, 0)
            if all((route.source, p) in known for p in range(count)):
                continue
            try:
                planned = plan_routes([route], plan.source_counts, dst, src, "the target")
            except KafkaSetupError as exc:
                if (route.source, 0) in known and route.target in dst and route.partition is None:
                    self._split(route, count, dst[route.target], known, str(exc), found)
                    continue
                self._once(
                    str(exc),
                    f"{exc}; relayed once that is fixed (looked at again every "
                    f"{self.cfg.discover.interval:g}s)",
                )
                continue
            found.routes.extend(r for r in planned if r.key not in known)
        return found

    @staticmethod
    def _split(
        route: TopicRoute, count: int, has: int, known: set[tuple[str, int]], why: str, into: Found
    ) -> None:
        """A relayed topic grown past its destination: each new partition the destination has
        is relayed, each it lacks is short (partition numbers are kept, never remapped)."""
        for p in range(count):
            if (route.source, p) not in known:
                new = PartitionRoute(route.source, p, route.target, p)
                if p < has:
                    into.routes.append(new)
                else:
                    into.short.append(Short(new, why))

    def _creations(
        self, missing: dict[str, int], routes: tuple[TopicRoute, ...]
    ) -> tuple[Creation, ...]:
        sources: dict[str, str] = {}
        for route in routes:  # the first route to a destination names its source, as before
            if route.target in missing:
                sources.setdefault(route.target, route.source)
        configs = self._configs(sorted(set(sources.values())))
        return tuple(
            Creation(
                dest, count, tuple(sorted(configs.get(sources[dest], {}).items())), sources[dest]
            )
            for dest, count in sorted(missing.items())
        )

    def _configs(self, topics: list[str]) -> dict[str, dict[str, str]]:
        """The configs set on each source topic that `[target]` says to copy (one request for
        all: a request per topic took 5 s for 400 topics)."""
        if not topics:
            return {}
        try:
            found = admin.topic_configs(self._source(), topics, self.timeout, set_only=True)
        except Exception as exc:  # noqa: BLE001 - the topics are created without them
            self._once(
                "configs",
                f"source does not describe topic configs ({exc}): created "
                "topics get the target's defaults",
            )
            return {}
        if not found:  # Apache Kafka describes every topic, with or without a config set
            self._once(
                "no-configs",
                "source describes no configs of its topics (Tansu "
                "answers DescribeConfigs with nothing): created topics get the target's "
                "defaults",
            )
        return {topic: self._copy.select(topic, configs) for topic, configs in found.items()}

    def _create(self, creations: tuple[Creation, ...]) -> None:
        """All in one request; if another ktm process was first for some, one by one."""
        if not creations:
            return
        try:
            self._call("target", self._creator(creations))
        except KafkaSetupError as exc:
            _raise_unless_exists(creations, exc)
            for creation in creations if len(creations) > 1 else ():  # which ones: ask each
                try:
                    self._call("target", self._creator((creation,)))
                except KafkaSetupError as one:
                    _raise_unless_exists((creation,), one)
        self.metrics.topics_created.inc(len(creations))
        each = log.info if len(creations) <= LOG_EACH_CREATED else log.debug
        for creation in creations:
            each(
                "created destination topic %s: %d partitions, replication factor %s, configs "
                "%s (from source topic %s)",
                creation.topic,
                creation.partitions,
                self.target.replication_factor
                if self.target.replication_factor > 0
                else "of the broker",
                dict(creation.configs) or "none",
                creation.source,
            )
        if len(creations) > LOG_EACH_CREATED:
            log.info("created %d destination topics (each: --debug)", len(creations))

    def _creator(self, creations: tuple[Creation, ...]) -> Callable[[], None]:
        def create() -> None:
            configs = {c.topic: dict(c.configs) for c in creations}
            counts = {c.topic: c.partitions for c in creations}
            try:
                topic_create.create_topics(
                    self.target.cluster,
                    counts,
                    self.timeout,
                    self.target.replication_factor,
                    configs,
                )
            except topic_create.ConfigRefused as exc:
                topic = exc.topic
                raise self._copy.refused(exc, counts[topic], configs[topic]) from exc

        return create

    def _grow(self, small: tuple[tuple[str, int, int], ...]) -> tuple[tuple[str, int, int], ...]:
        grown = []
        for dest, has, wanted in small:
            try:
                admin.grow_partitions(self.target.cluster, {dest: wanted}, self.timeout)
            except Exception as exc:
                if not isinstance(exc, admin.Unsupported) and is_retriable(exc):
                    raise  # while running: asked again at the next interval
                # grown by another ktm process, or by this one's earlier try that timed out:
                # the broker refuses a count it already has, and its metadata may lag it
                if isinstance(exc, InvalidPartitionsError):
                    made = self._await_count(dest, wanted)
                else:
                    made = self._has_partitions(dest, wanted)
                if made:
                    continue
                # refused for good (a policy, an ACL, no CreatePartitions): the partitions it
                # lacks are refused at start, halted while running
                self._once(
                    f"grow {dest}",
                    f"destination {dest} keeps {has} partitions, fewer "
                    f"than the {wanted} its source has: {exc}",
                )
                continue
            log.info("destination topic %s grown from %d to %d partitions", dest, has, wanted)
            self._await_count(dest, wanted)
            grown.append((dest, has, wanted))
        return tuple(grown)

    def _await_count(self, dest: str, wanted: int) -> bool:
        """Until the destination's metadata shows the partitions just added (at most the
        request timeout); whether it did. Apache Kafka acknowledges CreatePartitions before
        its brokers' metadata has them: under load the count read right after still said 2
        of 4, and the new source partitions were halted as lacking a destination."""
        deadline = time.monotonic() + self.timeout
        while not self._has_partitions(dest, wanted):
            if time.monotonic() > deadline:
                return False
            time.sleep(GROWN_POLL)
        return True

    def _has_partitions(self, dest: str, wanted: int) -> bool:
        """Whether the destination's metadata shows `wanted` partitions; False when it cannot
        say (a grow another ktm process made first is refused: InvalidPartitionsError)."""
        try:
            now = admin.partition_counts(self.target.cluster, {dest}, self.timeout)
        except Exception as exc:  # noqa: BLE001 - the refusal is what is reported
            log.debug("reading %s's partitions again: %s", dest, exc)
            return False
        return now.get(dest, 0) >= wanted

    def _once(self, key: str, line: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning("%s", line)


def _raise_unless_exists(creations: tuple[Creation, ...], exc: KafkaSetupError) -> None:
    """Raise, naming what was being created, unless another ktm process created it first."""
    if "TopicAlreadyExists" in str(exc):
        return
    first = repr(creations[0].topic)
    names = first if len(creations) == 1 else f"{len(creations)} topics ({first}, ...)"
    raise KafkaSetupError(f"[target].create_topics: creating {names}: {exc}") from exc


def needed_partitions(
    routes: tuple[TopicRoute, ...], source_counts: dict[str, int]
) -> dict[str, int]:
    """The partitions each destination needs: its sources' counts (partition numbers are
    kept), or the fixed partition + 1 of a "dest:N" route."""
    wanted: dict[str, int] = {}
    for route in routes:
        if route.source not in source_counts:
            continue
        count = source_counts[route.source] if route.partition is None else route.partition + 1
        wanted[route.target] = max(wanted.get(route.target, 0), count)
    return wanted
