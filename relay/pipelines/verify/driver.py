"""`ktm verify` on the driver: which destination partitions to read and which source ranges to
compare them with, spread over the slots; a batch job (relay.engine.batch).

The routes are the relay's own (`ktm check`'s dry run: no topic created, no group joined), so
renames, `dest:N` fan-in and [discover] patterns verify as they relay. The range of each source
partition is its log start (or `--partitions`' narrowing) up to its end offset read now.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from relay.clients import admin
from relay.config import ClusterConfig, Config
from relay.engine.batch import BatchPipeline
from relay.engine.metrics import Metrics
from relay.errors import ConfigError, KafkaSetupError
from relay.filters import FilterSpec, load_filters
from relay.pipelines.verify.executor import run
from relay.pipelines.verify.spec import (
    DestWork,
    Feeder,
    PartitionReport,
    VerifyResult,
    VerifyTask,
)
from relay.spec import PartitionRoute

Selection = dict[str, set[int] | None]  # topic -> partitions (None: all of them)


@dataclass(frozen=True)
class VerifyPlan:
    source: ClusterConfig
    target: ClusterConfig
    works: tuple[DestWork, ...]
    filters: tuple[FilterSpec, ...]
    clusters: tuple[str, ...]


class VerifyPipeline(BatchPipeline[VerifyTask, VerifyResult, list[PartitionReport]]):
    kind = "verify"
    run = staticmethod(run)

    def __init__(self, plan: VerifyPlan, timeout: float):
        self.plan, self.timeout = plan, timeout

    def tasks(self, slots: int) -> Sequence[VerifyTask]:
        """The destination partitions spread over the slots, biggest first, each to the least
        loaded task (a destination partition is read by one task, whole)."""
        bins: list[list[DestWork]] = [[] for _ in range(max(1, min(slots, len(self.plan.works))))]
        loads = [0] * len(bins)
        for work in sorted(self.plan.works, key=_size, reverse=True):
            least = loads.index(min(loads))
            bins[least].append(work)
            loads[least] += _size(work)
        p = self.plan
        return [VerifyTask(p.source, p.target, p.clusters, tuple(b), p.filters, self.timeout)
                for b in bins if b]  # fmt: skip

    def total(self, results: list[VerifyResult]) -> list[PartitionReport]:
        reports = [r for result in results for r in result.reports]
        return sorted(reports, key=lambda r: (r.key is None, r.key or ("", 0), r.dest))

    def slots_wanted(self) -> int:
        return max(1, len(self.plan.works))


def plan_verify(cfg: Config, failover: bool, selection: Selection | None) -> VerifyPlan:
    """The relay's routes (read as `ktm check` reads them), narrowed to `selection`, with the
    ranges to compare."""
    from relay.pipelines.relay.driver import RelayPipeline

    filters = load_filters(cfg)
    relay = RelayPipeline(cfg, stop_event=threading.Event(), metrics=Metrics(),
                          failover=failover, dry_run=True, filters=filters)  # fmt: skip
    try:
        routes = relay.plan(False, None).routes
        source = relay.pool.active
    finally:
        relay.close()
    routes = _select(routes, selection)
    target = cfg.need_target().cluster
    timeout = cfg.need_target().request_timeout * 5
    works = _works(source, target, routes, timeout)
    clusters = tuple(node.name for node in cfg.sources)
    return VerifyPlan(source, target, works, filters, clusters)


def _works(
    source: ClusterConfig, target: ClusterConfig, routes: list[PartitionRoute], timeout: float
) -> tuple[DestWork, ...]:
    src_begin, src_end = admin.offset_bounds(source, [r.key for r in routes], timeout)
    feeders: dict[tuple[str, int], list[Feeder]] = defaultdict(list)
    for r in routes:
        feeders[(r.target_topic, r.target_partition)].append(
            Feeder(r.key, src_begin[r.key], src_end[r.key])
        )
    try:
        dst_begin, dst_end = admin.offset_bounds(target, sorted(feeders), timeout)
    except KafkaSetupError as exc:
        raise ConfigError(f"[target]: {exc}") from exc
    return tuple(
        DestWork(topic, partition, dst_begin[(topic, partition)], dst_end[(topic, partition)],
                 tuple(sorted(fs, key=lambda f: f.key)))
        for (topic, partition), fs in sorted(feeders.items())
    )  # fmt: skip


def _select(routes: list[PartitionRoute], selection: Selection | None) -> list[PartitionRoute]:
    """The routes `--partitions` names; one naming what the relay does not carry is an error."""
    if not selection:
        return routes
    known: dict[str, set[int]] = defaultdict(set)
    for r in routes:
        known[r.topic].add(r.partition)
    for topic, partitions in selection.items():
        if topic not in known:
            raise ConfigError(f"--partitions: the relay carries no topic {topic!r}")
        unknown = sorted((partitions or set()) - known[topic])
        if unknown:
            raise ConfigError(
                f"--partitions: {topic} has no partition {unknown[0]} "
                f"(it has {len(known[topic])}: 0..{max(known[topic])})"
            )
    return [r for r in routes if r.topic in selection and _picked(selection[r.topic], r.partition)]


def _picked(partitions: set[int] | None, partition: int) -> bool:
    return partitions is None or partition in partitions


def _size(work: DestWork) -> int:
    return work.end - work.start


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
