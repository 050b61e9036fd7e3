"""What the runner needs of Spark, its control channel and its group membership, as Protocols:
relay.engine.driver.backend, relay.engine.spark, relay.engine.channel and
relay.engine.driver.membership give them, and the runner's test fakes are checked against them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from relay.clients.members import Assignment
from relay.spec import ChannelAddress, SourcePartition, TaskResult, TaskSpec

if TYPE_CHECKING:
    from relay.engine.executor.sides import Sides

T = TypeVar("T")
R = TypeVar("R")

# (channel address, slots) -> the spec of the clients the workers open first, and its sides
WarmSpec = Callable[[ChannelAddress, int], tuple[TaskSpec, Callable[..., "Sides"]]]


class Job(Protocol):
    """A round running: one Spark job whose tasks move their partitions."""

    def wait(self, timeout: float) -> bool:
        """True once the job ended."""
        ...

    def results(self) -> list[TaskResult]:
        """Every task's result; raises RelayError if the job itself failed."""
        ...

    def cancel(self) -> None: ...


class Batches(Protocol):
    """Task slots that run batch jobs (ktm verify's passes, ktm compact)."""

    slots: int  # task slots: at most one task each

    def run_batch(self, tasks: Sequence[T], run: Callable[[T], R]) -> list[R]:
        """`run` on one task per item, the results collected at the end."""
        ...


class Engine(Batches, Protocol):
    def submit(
        self, round_id: int, tasks: Sequence[TaskSpec], sides: Callable[..., Sides]
    ) -> Job: ...

    def refresh_slots(self) -> None: ...


class Channel(Protocol):
    """The driver's side of the control channel its tasks report to."""

    @property
    def address(self) -> ChannelAddress: ...

    def connected(self, round_id: int) -> int:
        """How many tasks of the round are connected now (a connection ends with its task,
        or with the task's process)."""
        ...

    def stop_round(self, round_id: int) -> None:
        """Ask the round's tasks to flush, commit and return."""
        ...

    def renew(self, round_id: int) -> None:
        """Answer the round's tasks now: a held round's leases, granted."""
        ...


class Backend(Protocol):
    start_seconds: float
    log_path: str | None
    used: bool  # a round ran: the workers hold clients worth closing

    @property
    def channel(self) -> Channel | None: ...

    def launch(self) -> None:
        """Launch what Spark's start needs before the partitions are known; safe twice."""
        ...

    def begin(self, partitions: int, warm: WarmSpec | None = None) -> None:
        """Start Spark in the background; safe twice."""
        ...

    def ready(self, partitions: int) -> tuple[Engine, Channel]:
        """The engine and the channel, once Spark is up."""
        ...

    def engine_slots(self) -> int: ...

    def stop(self) -> None: ...


class Members(Protocol):
    """This process's membership of its group (relay.engine.driver.membership)."""

    lease: float
    rebalances: int

    def current(self) -> Assignment | None: ...

    def assignment(self) -> Assignment | None: ...

    def wait_assigned(self, stop: threading.Event) -> Assignment | None: ...

    def await_assignment(self, seconds: float) -> None:
        """Return once an assignment is in force, or after `seconds`."""
        ...

    @property
    def first_join_of_empty_group(self) -> bool: ...

    @property
    def pending(self) -> bool: ...

    def plan(self, topics: Sequence[str], keys: list[SourcePartition]) -> None: ...

    def rejoin(self, topics: Sequence[str], keys: list[SourcePartition]) -> None: ...

    def may_write(self) -> bool: ...

    def leave(self) -> None: ...

    def close(self) -> None: ...
