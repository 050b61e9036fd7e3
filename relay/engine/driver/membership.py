"""Several ktm processes on one config: which source partitions this one may relay, and when.

Membership lives in a consumer group on the target cluster (relay.clients.members); this module
turns it into permission to write:

- Ownership: the partitions of the current assignment. A rebalance first *revokes*: before this
  process rejoins, `on_revoke` stops the running round (tasks flush, wait for acks, commit, end),
  so the new owner, which starts only once every member rejoined, reads a destination tail that
  no longer moves and resumes after it.
- Permission: the driver renews its tasks' leases (relay.engine.channel) only while
  `may_write()`: it holds an assignment and the coordinator confirmed the membership within half
  the session timeout. A process cut off from the group (frozen, partitioned, its poll loop
  stuck) stops renewing; its tasks stop writing once their lease (a quarter of the session
  timeout) runs out, that is within 3/4 of the session timeout after the last confirmation,
  before the coordinator can expire the member and hand its partitions to another one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from relay.clients import consumer_groups
from relay.clients.members import Assignment, Member
from relay.clients.settings import describe, is_retriable
from relay.config import ClusterConfig
from relay.engine.metrics import Metrics
from relay.errors import ConfigError, KafkaSetupError

log = logging.getLogger(__name__)

POLL_EVERY = 0.2  # seconds between the membership consumer's polls
EMPTY_CHECK = 5.0  # seconds to ask whether the group has members, before an early join
JOIN_TIMEOUT_FACTOR = 4  # the first assignment may take this many session timeouts


class Membership:
    def __init__(
        self,
        target: ClusterConfig,
        group: str,
        topics: Sequence[str],
        keys: Sequence[tuple[str, int]] | None,
        session_timeout: float,
        metrics: Metrics,
    ):
        """`keys` None: join before the partitions are known (`plan` gives them), if the group
        is empty; else wait for them (a member that joins a running group as PENDING would
        cost its members a second rebalance)."""
        self.target, self.group = target, group
        self.session_timeout = session_timeout
        self.lease = session_timeout / 4
        self.metrics = metrics
        self.on_revoke: Callable[[], None] = lambda: None
        self._topics = list(topics)
        self._keys = None if keys is None else list(keys)
        self._planned = threading.Event()  # the keys are known
        if keys is not None:
            self._planned.set()
        self._plan_lock = threading.Lock()  # `plan` and the Member's making
        self._assignment: Assignment | None = None
        self._member: Member | None = None
        self._last_poll = time.monotonic()
        self._joined_at = float("-inf")
        self._lapsed = False  # may_write said no, for a reason logged once
        self._found_empty = False  # joined a group that had no member
        self._ever_assigned = False
        self._rejoin_deadline: float | None = None  # a rejoin must end in an assignment by then
        self._replan: tuple[list[str], list[tuple[str, int]]] | None = None
        self._error: BaseException | None = None
        self._troubled_since: float | None = None  # polls fail (retriably) since
        self.rebalances = 0
        self._changed = threading.Condition()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ktm-membership", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def assignment(self) -> Assignment | None:
        """The assignment in force, or None (never raises: for other threads)."""
        return self._assignment

    def current(self) -> Assignment | None:
        """The assignment in force, or None while the group rebalances."""
        if isinstance(self._error, ConfigError):
            raise self._error
        if self._error is not None:
            raise KafkaSetupError(
                f"group {self.group} on {describe(self.target)}: {self._error}"
            ) from self._error
        deadline = self._rejoin_deadline
        if self._assignment is None and deadline is not None and time.monotonic() > deadline:
            # Seen on Tansu with two processes rejoining at once: the group never completes
            # the join. An exit (and a restart that joins afresh) beats a silent hang.
            raise KafkaSetupError(
                f"group {self.group} on {describe(self.target)}: no assignment within "
                f"{self._join_limit():.0f}s of rejoining with new partitions"
            )
        return self._assignment

    def _join_limit(self) -> float:
        return self.session_timeout * JOIN_TIMEOUT_FACTOR + 10

    def wait_assigned(self, stop: threading.Event) -> Assignment:
        """Block until the first assignment (or a stop request, or a clear failure)."""
        limit = self._join_limit()
        deadline = time.monotonic() + limit
        with self._changed:
            while self.current() is None and not stop.is_set():
                if time.monotonic() > deadline:
                    raise KafkaSetupError(
                        f"group {self.group} on {describe(self.target)}: no assignment within "
                        f"{limit:.0f}s"
                    )
                self._changed.wait(0.2)
        assignment = self._assignment
        if assignment is None:
            raise KafkaSetupError(f"group {self.group}: stopped before joining")
        return assignment

    def await_assignment(self, seconds: float) -> None:
        with self._changed:
            if self._assignment is None:
                self._changed.wait(seconds)

    def may_write(self) -> bool:
        """Whether the driver may renew its tasks' leases now."""
        member = self._member
        if self._assignment is None or member is None or self._closing.is_set():
            return False
        now = time.monotonic()
        if now - self._last_poll > max(2.0, self.session_timeout / 4):
            # the poll loop is stuck: it could miss a rebalance
            return self._not_writing(f"its poll loop has not run for {now - self._last_poll:.1f}s")
        confirmed = max(member.last_heartbeat(), self._joined_at)
        if now - confirmed >= self.session_timeout / 2:
            return self._not_writing(f"no heartbeat answered for {now - confirmed:.1f}s")
        if self._lapsed:
            self._lapsed = False
            log.info("group %s: tasks' leases are renewed again", self.group)
        return True

    def _not_writing(self, why: str) -> bool:
        """False, with a warning when the right to write lapses while assigned (once)."""
        if not self._lapsed:
            self._lapsed = True
            log.warning("group %s: tasks' leases are not renewed: %s", self.group, why)
        return False

    def leave(self) -> None:
        """Start leaving the group (the others take over at once, without waiting for a
        timeout); `close` waits until it is done. The membership thread notices within a poll
        (POLL_EVERY), time Spark's stop takes anyway."""
        self._closing.set()

    def close(self) -> None:
        self.leave()
        self._thread.join(timeout=10)

    @property
    def first_join_of_empty_group(self) -> bool:
        """Joining a group that had no member, with no assignment yet: the broker holds such a
        first join (`group.initial.rebalance.delay.ms`, 3 s by default) for others to come, and
        the first round may be planned meanwhile, held (relay.engine.driver.held)."""
        return self._found_empty and not self._ever_assigned

    @property
    def pending(self) -> bool:
        """Joined (or joining) before its partitions were known."""
        return not self._planned.is_set()

    def plan(self, topics: Sequence[str], keys: Sequence[tuple[str, int]]) -> None:
        """The partitions of a membership made without them: for the join still out, or, if
        an assignment came first, the next join (relay.clients.members: PENDING)."""
        with self._plan_lock:
            self._keys = list(keys)
            self._planned.set()
            member, moved = self._member, sorted(topics) != sorted(self._topics)
        if moved:
            self.rejoin(topics, keys)  # on the membership's thread: it subscribes again
        elif member is not None:
            member.plan(keys)

    def rejoin(self, topics: Sequence[str], keys: Sequence[tuple[str, int]]) -> None:
        """Rejoin to share other partitions (found while running): the same member, with the
        new plan, at its next poll. Members agree on the partitions they share: until every
        one found the same, the leader's plan holds and the others stand by
        (relay.clients.members). Nothing is owned until the new assignment."""
        self._keys = list(keys)
        self._assignment = None
        self._rejoin_deadline = time.monotonic() + self._join_limit()
        self._replan = (list(topics), list(keys))

    # ---- the membership thread ----------------------------------------------------------------

    def _loop(self) -> None:
        try:
            if not self._planned.is_set():
                self._found_empty = self._empty()
                while not self._found_empty and not self._planned.wait(POLL_EVERY):
                    if self._closing.is_set():
                        return  # stopped before the partitions were known: never joined
            member = Member(
                self.target,
                self.group,
                self._topics,
                self._keys,
                self.session_timeout,
                self._revoked,
                self._assigned,
            )
            with self._plan_lock:
                self._member, keys = member, self._keys
            if keys is not None:
                member.plan(keys)  # they came while the member was made
            while not self._closing.is_set():
                replan, self._replan = self._replan, None
                if replan is not None:
                    member.replan(*replan)
                self._poll(member)
        except Exception as exc:
            log.debug("membership loop failed", exc_info=True)
            self._error = exc
        finally:
            self._assignment = None
            if self._member is not None:
                self._member.close()
            with self._changed:
                self._changed.notify_all()

    def _poll(self, member: Member) -> None:
        """One poll. A retriable error (the coordinator restarting: a refused connection, a
        failed metadata refresh that kafka-python passes up) is not the end: the next poll
        asks again. Leases are not renewed meanwhile (no heartbeat answered, `may_write`);
        trouble that outlasts a join's time limit is."""
        try:
            member.poll(POLL_EVERY)
        except Exception as exc:
            if not is_retriable(exc):  # a ConfigError among them
                raise
            now = time.monotonic()
            if self._troubled_since is None:
                self._troubled_since = now
                log.warning("group %s: %s; polling again", self.group, exc)
            elif now - self._troubled_since > self._join_limit():
                raise
            self._closing.wait(POLL_EVERY)
        else:
            if self._troubled_since is not None:
                log.info("group %s: the coordinator answers again", self.group)
            self._troubled_since = None
        self._last_poll = time.monotonic()

    def _empty(self) -> bool:
        """Whether the group has no member now (DescribeGroups); False when it cannot say."""
        try:
            return consumer_groups.group_members(self.target, self.group, EMPTY_CHECK) == 0
        except Exception as exc:  # noqa: BLE001 - then the join waits for the partitions
            log.debug("group %s: members not described: %s", self.group, exc)
            return False

    def _revoked(self) -> None:
        """Called inside poll() before rejoining: stop writing first, then let the join go on."""
        had = self._assignment
        self._assignment = None
        if had is not None:
            log.info(
                "group %s rebalances: stopping work on %d partition(s)", self.group, len(had.keys)
            )
            self.metrics.rebalances.inc()
            self.rebalances += 1
        self.on_revoke()

    def _assigned(self, assignment: Assignment) -> None:
        if self._closing.is_set():
            return  # a join that ended while this member leaves (Member.close)
        self._joined_at = time.monotonic()  # the coordinator just confirmed us
        if not assignment.settled:
            log.debug(
                "group %s generation %d: made under another plan (joined before the partitions "
                "were known); waiting for the next",
                self.group,
                assignment.generation,
            )
            return
        self._rejoin_deadline = None
        self._assignment, self._ever_assigned = assignment, True
        self.metrics.assigned_partitions.set(len(assignment.keys))
        self.metrics.group_members.set(assignment.members)
        if assignment.standby:
            log.warning(
                "group %s: this process's topics or partition counts differ from the group "
                "leader's; standing by",
                self.group,
            )
        log.info(
            "group %s generation %d: this process owns %d of %d partitions (%d member%s)",
            self.group,
            assignment.generation,
            len(assignment.keys),
            len(self._keys or ()),
            assignment.members,
            "" if assignment.members == 1 else "s",
        )
        with self._changed:
            self._changed.notify_all()
