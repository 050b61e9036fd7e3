"""What the driver and the executors exchange: routes, task specs, results.

Shared by both sides and pure (no Kafka, no Spark). Specs and results are small frozen
dataclasses: Spark pickles a spec to an executor and the result back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relay.filters import FilterSpec

# the header every copy carries, shared by both sides like the rest (relay.provenance.header)
from relay.provenance.header import PROVENANCE_HEADER as PROVENANCE_HEADER
from relay.provenance.header import origin_topic

SourcePartition = tuple[str, int]  # (source topic, partition)


@dataclass(frozen=True)
class PartitionRoute:
    topic: str
    partition: int
    target_topic: str
    target_partition: int
    # how many times the source topic was followed into the same destination after it was
    # deleted and created again (relay.provenance.header: the header's `~n`)
    incarnation: int = 0

    @property
    def key(self) -> SourcePartition:
        return (self.topic, self.partition)

    @property
    def origin(self) -> SourcePartition:
        """(topic as the provenance header names it, partition): this incarnation's copies."""
        return (origin_topic(self.topic, self.incarnation), self.partition)


@dataclass(frozen=True)
class PartitionWork:
    """One source partition of a task: relay from `start` (the next offset, the first one not
    yet at the destination) up to `stop` (exclusive; None: until told to stop)."""

    route: PartitionRoute
    start: int  # restore's FROM_FIRST_SEGMENT: --follow, the store had no segment of it yet
    stop: int | None = None


@dataclass(frozen=True)
class ChannelAddress:
    """Where a task reports its progress and hears "stop" (see relay.engine.channel)."""

    host: str
    port: int
    token: str = field(repr=False)  # per run; proves a connection comes from this run's tasks


@dataclass(frozen=True)
class Rates:
    """A task's share of `[limits]` (0: no limit); relay.engine.executor.throttle keeps it."""

    records_per_second: float = 0.0
    bytes_per_second: float = 0.0


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """What every task spec carries: its place in the round, its partitions, where it
    reports, its share of `[limits]`, its filters. Each pipeline's spec (its folder's spec.py)
    adds where its tasks read and write; Spark pickles a spec to an executor."""

    round_id: int
    task_id: int
    partitions: tuple[PartitionWork, ...]
    channel: ChannelAddress  # where to report; the driver's answers grant the lease to write
    report_interval: float = 0.5
    rates: Rates = Rates()
    filters: tuple[FilterSpec, ...] = ()
    # source records deleted before they were read: "warn" goes on, "stop" halts the partition
    # ([source_pool].on_loss, relay.losses)
    on_loss: str = "warn"


# What a run of records written became, as far as a task can tell (PartitionProgress.unsure)
ACKED, NOT_WRITTEN, UNKNOWN = 1, 0, -1


@dataclass(frozen=True)
class PartitionProgress:
    """One partition's totals since the task attempt started (cumulative, so a lost report
    costs nothing: the next one carries everything)."""

    key: SourcePartition
    next_offset: int  # first source offset NOT yet acknowledged by the destination
    consumed: int = 0
    produced: int = 0
    produced_bytes: int = 0
    highwater: int | None = None
    reached_stop: bool = False
    filtered: tuple[tuple[str, int], ...] = ()  # (filter id, records it dropped)
    filter_errors: tuple[tuple[str, int], ...] = ()  # (filter id, records it raised on, skipped)
    segments: int = 0  # segments written to the store (backup)
    # restore --follow: what the partition waits for ("empty": its first segment, "late": a
    # segment missing between two others) and for how many seconds; None when not waiting
    waiting: tuple[str, float] | None = None
    # records written after failed ones were acknowledged: the destination's tail is past
    # records it lacks, so the partition resumes exactly at next_offset (see KafkaWriter in
    # relay.pipelines.kafka_target)
    hole: bool = False
    # in a task's last report: (first source offset, records, ACKED / NOT_WRITTEN / UNKNOWN:
    # relay.clients.delivery) of each run written and not counted as acknowledged; the driver
    # counts those it finds at the destination afterwards and never resumes past a refused one
    unsure: tuple[tuple[int, int, int], ...] = ()
    # source offsets lost to the copy (first, end exclusive, cause: relay.losses), in order
    lost: tuple[tuple[int, int, str], ...] = ()


@dataclass(frozen=True)
class TaskError:
    kind: str  # "source", "target", "filter", "internal", "channel"
    message: str
    retriable: bool
    key: SourcePartition | None = None  # the partition it concerns, when known
    # the destination refused the record at this source offset for good: the partition halts
    # there (relay.refusals); `message` names the record and the destination's rule
    halt_at: int | None = None
    # the partition halts because these source offsets are lost (first, end, cause)
    lost: tuple[int, int, str] | None = None


@dataclass(frozen=True)
class FetchTrouble:
    """A source broker the task's fetches had trouble with since its last report: fetches that
    failed (refused, timed out, cut off) and how long the oldest one still out has waited (a
    slow or frozen broker fails nothing for a while; it just does not answer)."""

    node: str  # "host:port"
    failures: int  # since the last report
    error: str  # the last failure, "Type: message"; "" when none failed
    waiting: float  # seconds; 0 when no fetch is out to it


@dataclass(frozen=True)
class TaskResult:
    """What a task reports when it ends (the same shape as its live reports, plus the end)."""

    round_id: int
    task_id: int
    attempt: int
    partitions: tuple[PartitionProgress, ...]
    error: TaskError | None = None
    elapsed: float = 0.0
    worker_pid: int = 0
    latencies: tuple[float, ...] = ()  # sampled source-timestamp -> destination-ack seconds
    trouble: tuple[FetchTrouble, ...] = ()
    throttled: float = 0.0  # seconds reads were held back by [limits] (cumulative)
