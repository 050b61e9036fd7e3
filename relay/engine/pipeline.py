"""What differs between ktm's pipelines (relay, backup, restore), behind one small interface.

The driver's machinery is shared: Spark started in the background, group membership, rounds of
partition groups, live progress, retries, stop. A pipeline says where its partitions come from,
where each one really stands (the destination's provenance tail, or the store), what a task
spec looks like, and whether to move to another source node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from relay.config import ClusterConfig
from relay.spec import ChannelAddress, PartitionRoute, PartitionWork, Rates, SourcePartition

REPORT_INTERVAL = 0.5  # seconds between a task's progress reports to the driver


@dataclass(frozen=True)
class Plan:
    routes: list[PartitionRoute]
    next_offsets: dict[SourcePartition, int]  # where each source partition resumes
    ends: dict[SourcePartition, int]  # the source's end offsets now
    stops: dict[SourcePartition, int] | None  # --stop-at-end targets


class Pipeline(Protocol):
    kind: str  # "relay", "backup", "restore": names the coordination group and the logs
    coordinator: ClusterConfig  # the cluster whose consumer group the processes share
    group_topics: Sequence[str]  # topics of that cluster the membership subscribes to

    @property
    def sides(self) -> Callable[[Any], Any]:
        """The executor side: makes a task's Sides (relay.engine.executor.sides) from its spec.
        A class of an importable module, so Spark ships it to the executors by reference."""
        ...

    def plan(
        self, stop_at_end: bool, on_routes: Callable[[list[PartitionRoute]], None] | None
    ) -> Plan: ...

    def active_source(self) -> str:
        """The name of the node records come from (for the status)."""
        ...

    def where(self, routes: Sequence[PartitionRoute]) -> dict[SourcePartition, int]:
        """Next offsets the destination (or store) really holds: after a failed round, and
        for partitions this process just took over."""
        ...

    def adopt(self, routes: Sequence[PartitionRoute]) -> None:
        """This process owns these partitions now (nobody else writes them)."""
        ...

    def task(
        self,
        round_id: int,
        task_id: int,
        works: tuple[PartitionWork, ...],
        channel: ChannelAddress,
        rates: Rates,
    ) -> Any:
        """The picklable spec of one task (relay.engine.executor.task runs it), with its share
        of `[limits]`."""
        ...

    def fail_over(self, nexts: dict[SourcePartition, int], urgent: bool) -> bool:
        """Between rounds: switch source nodes if needed; True if it switched (raises
        ConnectionError if none can serve)."""
        ...

    def wants_switch(self, nexts: dict[SourcePartition, int]) -> bool:
        """During a round: whether to end it to switch nodes."""
        ...

    def views(self) -> list[Any]:
        """Health-check answers of the source nodes (for the status)."""
        ...

    def tick(self) -> None:
        """Called about five times a second while a round runs (periodic chores)."""
        ...

    def has_changes(self) -> bool:
        """Whether partitions were found since the plan (the round then ends to take them)."""
        ...

    def changes(self) -> Plan | None:
        """The partitions found since the plan, with where each starts (taken once)."""
        ...

    def close(self) -> None: ...
