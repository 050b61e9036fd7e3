"""What differs between ktm's pipelines (relay, backup, restore), behind one small interface.

The driver's machinery is shared: Spark started in the background, the membership of ktm
processes, rounds of tasks, live progress, retries, stop. A pipeline says where its partitions
come from, where each one really stands (the destination's provenance tail, or the store), what
a task spec looks like, and whether to move to another source node.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict, Unpack

from relay.config import ClusterConfig
from relay.spec import (
    ChannelAddress,
    PartitionRoute,
    PartitionWork,
    Rates,
    SourcePartition,
    TaskSpec,
)

if TYPE_CHECKING:
    from relay.engine.executor.sides import Sides

REPORT_INTERVAL = 0.5  # seconds between a task's progress reports to the driver


@dataclass(frozen=True)
class Halt:
    route: PartitionRoute
    offset: int  # source offset of the first refused record: everything before it is relayed
    reason: str  # the destination's refusal, naming the record and the broker's rule

    @property
    def where(self) -> str:
        r = self.route
        target = f"{r.target_topic}[{r.target_partition}]"
        return f"{r.topic}[{r.partition}] at offset {self.offset} (-> {target})"

    def as_dict(self) -> dict[str, object]:
        r = self.route
        return {
            "source_topic": r.topic,
            "source_partition": r.partition,
            "offset": self.offset,
            "target_topic": r.target_topic,
            "target_partition": r.target_partition,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class NodeView:
    """One health check's answer: up with its end offsets, or down with the reason."""

    name: str
    up: bool
    ends: dict[SourcePartition, int] = field(default_factory=dict)
    error: str | None = None


class CommonFields(TypedDict):
    """The fields every task spec shares (relay.spec.TaskSpec), as `Pipeline.spec` gets them."""

    round_id: int
    task_id: int
    partitions: tuple[PartitionWork, ...]
    channel: ChannelAddress
    report_interval: float
    rates: Rates


@dataclass(frozen=True)
class Partitions:
    """What `Pipeline.partitions` found: the routes, or (`routes` None) what start-up waits for,
    to be asked again `again_in` seconds later."""

    routes: list[PartitionRoute] | None
    waiting: Mapping[str, str] = field(default_factory=dict)  # topic -> what it waits for
    again_in: float = 0.0


@dataclass(frozen=True)
class Progress:
    """What a pipeline sees of the run at each tick (read-only): the next offset of every
    partition, and the partitions this process owns (None until its group assigns them)."""

    next_offsets: Mapping[SourcePartition, int]
    owned: frozenset[SourcePartition] | None


@dataclass(frozen=True)
class Plan:
    routes: list[PartitionRoute]
    next_offsets: dict[SourcePartition, int]  # where each source partition resumes
    ends: dict[SourcePartition, int]  # the source's end offsets now
    stops: dict[SourcePartition, int] | None  # --stop-at-end targets


class Pipeline(abc.ABC):
    """A pipeline as the driver runs it. A subclass sets `kind`, `sides`, `coordinator` and
    `group_topics`, and gives `partitions`, `resume`, `where`, `spec` and `active_source`; the
    optional capabilities (failover, partitions found while running, chores) default to "none"
    here, so a pipeline without them writes nothing for them.

    Data goes one way: the runner asks, the pipeline answers. Start-up is `partitions` (asked
    again while it says it waits), then the runner starts Spark and joins the group, then
    `resume`; while running, each `tick` shows the pipeline the run's progress and takes back
    the partitions it found must halt.

    kind: "relay", "backup", "restore": names the coordination group and the logs.
    sides: the executor side, a class of an importable module making a task's Sides from its
        spec (relay.engine.executor.sides); Spark ships it to the executors by reference.
    coordinator, group_topics: the cluster whose consumer group the processes share, and the
        topics of it the membership subscribes to.
    """

    kind: str
    sides: Callable[..., Sides]
    coordinator: ClusterConfig
    group_topics: Sequence[str]

    # ---- what every pipeline says ------------------------------------------------------------

    @abc.abstractmethod
    def partitions(self) -> Partitions:
        """The partitions to copy, with the clusters and topics checked (and what start-up
        waits for, if it must wait); Spark starts and the group forms while `resume` runs."""

    @abc.abstractmethod
    def resume(self, routes: list[PartitionRoute], stop_at_end: bool) -> Plan:
        """Where each of the partitions `partitions` found stands, and where it stops."""

    @abc.abstractmethod
    def where(self, routes: Sequence[PartitionRoute]) -> dict[SourcePartition, int]:
        """Next offsets the destination (or store) really holds: after a failed round, and
        for partitions this process just took over."""

    def task(
        self,
        round_id: int,
        task_id: int,
        works: tuple[PartitionWork, ...],
        channel: ChannelAddress,
        rates: Rates,
    ) -> TaskSpec:
        """The picklable spec of one task (relay.engine.executor.task runs it), with its share
        of `[limits]`: the fields every spec shares, and the pipeline's own (`spec`)."""
        return self.spec(
            round_id=round_id,
            task_id=task_id,
            partitions=works,
            channel=channel,
            report_interval=REPORT_INTERVAL,
            rates=rates,
        )

    def warm_task(
        self, routes: Sequence[PartitionRoute], channel: ChannelAddress, rates: Rates
    ) -> TaskSpec:
        """The spec whose clients each worker opens before the first round (`Sides.warm`), for
        one partition of each topic: the topics are what is warmed. Across a 240 ms link the
        clients' bootstraps, metadata and leader connections cost over a second, paid while the
        group forms (a new group's first rebalance is delayed by seconds)."""
        first_of_topic = {r.topic: r for r in routes}
        works = tuple(PartitionWork(r, 0, None) for r in first_of_topic.values())
        return self.task(0, 0, works, channel, rates)

    @abc.abstractmethod
    def spec(self, **common: Unpack[CommonFields]) -> TaskSpec:
        """The pipeline's task spec from the fields every spec shares (relay.spec.TaskSpec:
        round and task id, partitions, channel, report interval, rates) and its own."""

    @abc.abstractmethod
    def active_source(self) -> str:
        """The name of what records come from (for the status)."""

    # ---- optional capabilities ----------------------------------------------------------------

    def adopt(self, routes: Sequence[PartitionRoute]) -> None:
        """This process owns these partitions now (nobody else writes them)."""
        return None  # nothing, unless a pipeline says otherwise

    def fail_over(self, nexts: dict[SourcePartition, int], urgent: bool) -> bool:
        """Between rounds: switch source nodes if needed; True if it switched (raises
        ConnectionError if none can serve). Default: one source, nothing to switch."""
        return False

    def wants_switch(self, nexts: dict[SourcePartition, int]) -> bool:
        """During a round: whether to end it to switch nodes."""
        return False

    def views(self) -> list[NodeView]:
        """Health-check answers of the source nodes (for the status)."""
        return []

    def tick(self, progress: Progress) -> Sequence[Halt]:
        """Called about five times a second while running (periodic chores), with the run's
        progress; gives back the partitions found since that must halt, each once."""
        return ()

    def recreated(self) -> list[tuple[str, str]]:
        """Source topics found deleted and created again since they were first seen, each once:
        (topic, one line naming both topic IDs); the runner halts their partitions, or has them
        followed (`follows_recreated`)."""
        return []

    follows_recreated = False  # recreated topics are followed into the same destination

    def look_again(self) -> int:
        """Have the source topics' IDs read at once (a log found truncated may be a recreated
        topic); the number of that look, ended once `looked` reaches it."""
        return 0

    def looked(self) -> int:
        """The number of the latest look at the source topics' IDs that was answered."""
        return 0

    def follow(self, routes: list[PartitionRoute], owned: frozenset[SourcePartition]) -> Plan:
        """Routes of recreated topics at their next incarnation, from the new topics' log starts
        (those the new topics lack left out); the partitions in `owned` remember it in the
        relay group before any copy of the new topics (relay.pipelines.recreated). A pipeline
        that does not follow follows none: they halt."""
        return Plan([], {}, {}, None)

    def has_changes(self) -> bool:
        """Whether partitions were found since the plan (the round then ends to take them)."""
        return False

    def changes(self) -> Plan | None:
        """The partitions found since the plan, with where each starts (taken once)."""
        return None

    def head_start(self) -> None:
        """Open ahead, while `partitions` asks its questions, clients `resume` will use (on
        the same thread: relay.clients.kept)."""
        return None

    def close(self) -> None:
        """Release what the pipeline holds; safe twice."""
        return None  # nothing, unless a pipeline says otherwise
