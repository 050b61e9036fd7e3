"""Which source partitions this process may relay, and whether a round may still write.

ktm processes sharing a config form a group on the destination cluster, named
`<[app].group_id>.<pipeline kind>` (relay.engine.driver.membership: Kafka's group protocol
assigns each member its partitions). A round is planned under one assignment (its
*generation*); its tasks write only under a lease the driver renews while this process still
holds that assignment and the group can vouch for it. Without a group (nothing to relay yet, or
the runner's unit tests) the process owns every partition.

Used from the runner's thread (planning, rounds), the channel's thread (`lease_for`) and the
membership's thread (`on_revoke`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from relay.clients.members import Assignment
from relay.config import ClusterConfig, Config
from relay.engine.driver.membership import Membership
from relay.engine.driver.seams import Members
from relay.engine.metrics import Metrics
from relay.spec import SourcePartition

NO_ROUND = -1  # the generation of a round planned without a group


class Ownership:
    def __init__(self, cfg: Config, kind: str, metrics: Metrics):
        self.group = f"{cfg.app.group_id}.{kind}"
        self.session_timeout, self.metrics = cfg.app.session_timeout, metrics
        self.membership: Members | None = None
        self.generation: int | None = None  # of the assignment the runner last took up
        self._round: tuple[int, int] | None = None  # (round id, the generation it was planned in)
        self._held: int | None = None  # a round planned before the first assignment (held.py)

    def join(
        self,
        coordinator: ClusterConfig,
        topics: Sequence[str],
        keys: Sequence[SourcePartition] | None,
        on_revoke: Callable[[], None],
    ) -> Members:
        """Join the group on `coordinator` once (later calls return the membership);
        `on_revoke` runs on the membership's thread before a rebalance goes on. `keys` None:
        join before the partitions are known, if the group is empty (a new group's first join
        is held seconds by the broker: the partition counts come meanwhile); a later call
        gives them."""
        if self.membership is None:
            membership = Membership(
                coordinator,
                self.group,
                topics,
                None if keys is None else list(keys),
                self.session_timeout,
                self.metrics,
            )
            membership.on_revoke = on_revoke
            membership.start()
            self.membership = membership
        elif keys is not None and self.membership.pending:
            self.membership.plan(topics, list(keys))
        return self.membership

    def rejoin(self, topics: Sequence[str], keys: Sequence[SourcePartition]) -> None:
        """The partitions changed: the members must agree on them again."""
        assert self.membership is not None
        self.generation = None
        self.membership.rejoin(topics, list(keys))

    def settled(self) -> bool:
        """Not rebalancing (never raises: any thread)."""
        return self.membership is None or self.membership.assignment() is not None

    def current(self, every: frozenset[SourcePartition]) -> tuple[Assignment | None, bool]:
        """The assignment in force (of `every` partition without a group; None while the group
        rebalances), and whether it is new since the runner last took one up (`take_up`: it
        first learns where its partitions stand)."""
        if self.membership is None:
            return Assignment(NO_ROUND, every, 1), False
        assignment = self.membership.current()
        return assignment, assignment is not None and assignment.generation != self.generation

    def take_up(self, assignment: Assignment) -> None:
        self.generation = assignment.generation

    def holds(self, round_id: int | None = None) -> bool:
        """Whether this process still holds the assignment a round was planned under (None:
        the one the next round would be) and may write under it."""
        membership = self.membership
        if membership is None:
            return round_id is None or (self._round is not None and self._round[0] == round_id)
        # the runner's thread sees the group's errors; the channel's never raises
        assignment = membership.current() if round_id is None else membership.assignment()
        if round_id is not None and round_id == self._held:
            return True  # it reads, writing nothing, until the runner confirms or stops it
        if round_id is None:
            wanted: int | None = self.generation
        elif self._round is not None and self._round[0] == round_id:
            wanted = self._round[1]
        else:
            return False  # an earlier round's task: never again
        return assignment is not None and assignment.generation == wanted and membership.may_write()

    def begin_round(self, round_id: int, held: bool = False) -> None:
        """A round is planned under the current generation; earlier rounds lose their leases.
        A held round is planned before the group's first assignment: its tasks read but do
        not write until `confirm` (relay.engine.driver.held)."""
        self._round = (round_id, self.generation if self.generation is not None else NO_ROUND)
        self._held = round_id if held else None

    def may_hold(self) -> bool:
        """Whether a round may be planned before the first assignment: the process joined a
        group that had no member (relay.engine.driver.membership), which has not answered yet."""
        membership = self.membership
        return membership is not None and membership.first_join_of_empty_group

    def confirm(self, round_id: int) -> None:
        """The held round's partitions are this process's under the generation taken up."""
        assert self._held == round_id and self.generation is not None
        self._round, self._held = (round_id, self.generation), None

    def lease_for(self, round_id: int) -> float | None:
        """Seconds of writing granted to a round's tasks, or None (channel thread)."""
        membership = self.membership
        if membership is None or round_id == self._held or not self.holds(round_id):
            return None
        return membership.lease

    def hold_for(self, round_id: int) -> float | None:
        """Seconds a held round's tasks may go on reading ahead, or None (channel thread)."""
        membership = self.membership
        if membership is None or round_id != self._held or not self.holds(round_id):
            return None
        return membership.lease

    def leave(self) -> None:
        """Leave the group (others take the partitions over at once)."""
        if self.membership is not None:
            self.membership.leave()

    def close(self) -> None:
        if self.membership is not None:
            self.membership.close()

    @property
    def rebalances(self) -> int:
        return self.membership.rebalances if self.membership is not None else 0
