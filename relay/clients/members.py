"""Group membership through Kafka's consumer-group protocol (kafka-python), without consuming.

ktm processes that share a config join one consumer group on the target cluster (the one cluster
every mode shares). The group protocol elects a leader and hands every member an assignment;
ktm's own assignor puts the *source* partitions a member owns in the assignment's user data and
assigns no Kafka partition at all, so the membership consumer never fetches a record. The
source partitions need not exist on the target cluster, and failover nodes (different source
clusters) do not matter: the unit of ownership is (source topic, partition).

Rebalances are eager: before a member rejoins, `on_revoke` runs (in the consumer's poll, which
blocks the join), and the member stops writing there; the new owner gets a partition only after
every member rejoined. See relay.engine.driver.membership for how ownership turns into permission to
write.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypedDict, cast

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from kafka.errors import InvalidSessionTimeoutError
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)

from relay import internals
from relay.clients.admin import broker_settings
from relay.clients.settings import (
    NO_CLIENT_METRICS,
    client_settings,
    describe,
    never_create_topics,
)
from relay.config import ClusterConfig
from relay.errors import ConfigError

if TYPE_CHECKING:  # kafka-python's own class (untyped: it says what an argument is)
    from kafka.cluster import ClusterMetadata

log = logging.getLogger(__name__)

Key = tuple[str, int]
# The plan of a member that joined before it knew its partitions (the group's first join is
# held seconds by the broker; the partition counts come meanwhile): it owns nothing under it.
PENDING = "pending"
# Seconds a poll waits for a join that is out (it returns when the join ends): the longer, the
# rarer a join ending between two polls (and thrown away by kafka-python); a stop waits for it.
JOIN_POLL = 2.0
HELD_JOIN_WAIT = 4.0  # seconds a close waits for a join out to end, before it leaves


@dataclass(frozen=True)
class Assignment:
    generation: int
    keys: frozenset[Key]  # the source partitions this member may relay
    members: int  # how many members the group has
    standby: bool = False  # True: the leader's plan differs from ours; we were given nothing
    # False: made under a plan this member no longer holds (one joined as PENDING): it stands
    # for nothing, and this member rejoins (or waits for its own plan first)
    settled: bool = True


class JoiningMember(Protocol):
    """A member as the group's leader sees it when it assigns (kafka-python's
    JoinGroupResponseMember, its metadata decoded)."""

    member_id: str
    metadata: ConsumerProtocolSubscription


class _UserData(TypedDict, total=False):
    """What ktm's members put in the group protocol's user data, as JSON: the subscription's
    (`plan`, `host`, `pid`) and the assignment's (`keys`, `members`, `standby`)."""

    plan: str  # a subscription's, and an assignment's: the leader's when it assigned
    host: str
    pid: int
    member: str  # a member's own mark, for the leader to know its own subscription
    keys: list[list[str | int]]  # [topic, partition] pairs
    members: int
    standby: bool


def fingerprint(keys: Sequence[Key] | None) -> str:
    """What the members must agree on: the same source partitions (same config, same counts);
    PENDING while they are not known."""
    return PENDING if keys is None else json.dumps(sorted(keys), separators=(",", ":"))


def split(keys: Sequence[Key], members: Sequence[str]) -> dict[str, list[Key]]:
    """Round-robin over sorted keys and sorted member ids: every member within one partition of
    the others, and the same answer whoever computes it."""
    ordered = sorted(members)
    shares: dict[str, list[Key]] = {member: [] for member in ordered}
    for index, key in enumerate(sorted(keys)):
        shares[ordered[index % len(ordered)]].append(key)
    return shares


class KtmAssignor(AbstractPartitionAssignor):
    """Assigns source partitions (in user data) instead of the subscribed topic's partitions."""

    name = "ktm-v1"
    version = 0

    def __init__(self, keys: Sequence[Key] | None, on_assignment: Callable[[Assignment], None]):
        self._on_assignment = on_assignment
        # The plan the last join carried, and whether an assignment came for a plan changed
        # since while this member stood by: it must join again, or it stands by for good (seen:
        # partitions found while a rebalance was out; the join carried the old plan and the
        # rejoin asked for meanwhile was lost with it).
        self._sent: str | None = None
        self.stale = False
        self._mark = uuid.uuid4().hex
        self._assigned: str | None = None  # the plan the last assignment was made under
        self._standby = False  # and whether it left this member standing by
        self._leading = False  # this member made the assignment coming (its group's leader)
        self._led = False  # and made the last one
        # update() comes from the runner's thread while a join may be assigning
        self._lock = threading.Lock()
        self.update(keys)

    def update(self, keys: Sequence[Key] | None) -> None:
        """The partitions to share from the next join on, or from the join still out: the
        leader assigns with the plan it holds when the join ends."""
        with self._lock:
            self._keys = sorted(keys or ())
            self._plan = fingerprint(keys)
            self._judge()

    def _judge(self) -> bool:
        """Whether the last assignment stands for this member's plan (`settled`), and whether
        it must join again for one that does (`stale`). Under the lock."""
        assigned, plan = self._assigned, self._plan
        self.stale = False
        if assigned is None or plan == PENDING:
            return False  # nothing assigned yet, or nothing to own yet
        if assigned == PENDING:
            # made before its leader knew its partitions: the leader joins again once it does
            # (the others wait for that rebalance rather than rejoin meanwhile, again and again)
            self.stale = self._led
            return False
        if assigned == plan and not self._standby:
            return True
        if self._sent != plan:
            self.stale = True  # joined with a plan this member no longer holds
            return False
        return True  # its config differs from the leader's: it stands by, as it should

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolSubscription:
        with self._lock:
            self._sent = self._plan
            me = {"plan": self._plan, "host": socket.gethostname(), "pid": os.getpid()}
        me["member"] = self._mark
        return ConsumerProtocolSubscription(self.version, list(topics), json.dumps(me).encode())

    def assign(
        self, cluster: ClusterMetadata, members: Sequence[JoiningMember]
    ) -> dict[str, ConsumerProtocolAssignment]:
        with self._lock:
            plan, keys = self._plan, self._keys
            self._leading = True
        agreeing: list[str] = []
        others: list[str] = []
        for member in members:
            info = _json(member.metadata.user_data)
            # this member itself, joined before it knew its partitions, holds the plan it
            # knows now (a plan that changed since its join leaves it standing by, as others)
            mine = info.get("member") == self._mark and info.get("plan") == PENDING
            ours = info.get("plan") == plan or mine
            (agreeing if ours else others).append(member.member_id)
        if others and plan != PENDING:
            log.warning(
                "%d group member(s) run with other topics or partition counts; they stand by "
                "until their config matches the leader's",
                len(others),
            )
        shares = split(keys, agreeing)
        total = len(agreeing) + len(others)
        result = {}
        for member_id in agreeing + others:
            data: dict[str, object] = {"keys": shares.get(member_id, []), "members": total}
            data["standby"] = member_id in others
            data["plan"] = plan
            result[member_id] = ConsumerProtocolAssignment(
                self.version, [], json.dumps(data).encode()
            )
        return result

    def on_assignment(self, assignment: ConsumerProtocolAssignment, generation: int) -> None:
        data = _json(assignment.user_data)
        standby = bool(data.get("standby"))
        with self._lock:
            # the leader's plan (an older ktm's leader says none: taken to be ours unless it
            # left us standing by)
            self._assigned = data.get("plan", "" if standby else self._plan)
            self._standby = standby
            self._led, self._leading = self._leading, False
            settled = self._judge()
        keys = frozenset((str(t), int(p)) for t, p in data.get("keys", []))
        number = getattr(generation, "generation_id", generation)
        members = int(data.get("members", 1))
        self._on_assignment(Assignment(int(number), keys, members, standby, settled))


def _json(data: bytes | None) -> _UserData:
    try:
        parsed = json.loads(data or b"{}")
    except ValueError:
        return {}
    # cast: only ktm's members write it (`metadata`, `assign`); readers convert each field
    return cast(_UserData, parsed) if isinstance(parsed, dict) else {}


class _Listener(ConsumerRebalanceListener):
    def __init__(self, on_revoke: Callable[[], None]):
        self._on_revoke = on_revoke

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self._on_revoke()

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        pass


class Member:
    """One membership consumer. Call `poll()` regularly from one thread; it (re)joins the group,
    and runs `on_revoke` / `on_assignment` from inside that call."""

    def __init__(
        self,
        cluster: ClusterConfig,
        group: str,
        topics: Sequence[str],
        keys: Sequence[Key] | None,
        session_timeout: float,
        on_revoke: Callable[[], None],
        on_assignment: Callable[[Assignment], None],
    ):
        session_ms = int(session_timeout * 1000)
        self._assignor = KtmAssignor(keys, on_assignment)
        self._listener = _Listener(on_revoke)
        self._topics = sorted(topics)
        self._consumer = KafkaConsumer(
            **client_settings(cluster, 10.0),
            **NO_CLIENT_METRICS,
            group_id=group,
            enable_auto_commit=False,
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=max(100, session_ms // 5),
            # The rebalance timeout: how long the group waits for a member to stop and rejoin.
            max_poll_interval_ms=max(session_ms * 3, 30_000),
            partition_assignment_strategy=[self._assignor],
        )
        never_create_topics(self._consumer)
        self._consumer.subscribe(topics=list(topics), listener=self._listener)
        self._closed = False
        self._cluster, self._session = cluster, session_timeout

    def plan(self, keys: Sequence[Key]) -> None:
        """The partitions of a member that joined as PENDING, for the join still out (its
        leader assigns with them) or the next one. Any thread."""
        self._assignor.update(keys)

    def replan(self, topics: Sequence[str], keys: Sequence[Key]) -> None:
        """Share other partitions: this member rejoins with them, without leaving the group (a
        leave and a join by two processes at once was seen to stall Tansu's group for good).
        From the polling thread only, like poll()."""
        self._assignor.update(keys)
        if sorted(topics) != self._topics:
            self._topics = sorted(topics)
            self._consumer.subscribe(topics=list(topics), listener=self._listener)
        internals.request_rejoin(self._consumer)

    def poll(self, timeout: float) -> None:
        """Polls for `timeout` seconds; while a join is out, waits for it up to JOIN_POLL
        instead (internals.joining: a join that ends between two polls is thrown away). A
        session timeout the broker refuses is a ConfigError naming the key and its limits."""
        try:
            self._poll(timeout)
        except InvalidSessionTimeoutError as exc:
            raise self._session_refused() from exc

    def _session_refused(self) -> ConfigError:
        names = ("group.min.session.timeout.ms", "group.max.session.timeout.ms")
        try:
            limits = broker_settings(self._cluster, names, 10.0)
        except Exception as exc:  # noqa: BLE001 - the key is named either way
            log.debug("describing the broker's session limits: %s", exc)
            limits = {}
        allowed = ", ".join(f"{name} = {limits[name]}" for name in names if name in limits)
        return ConfigError(
            f"[app].session_timeout = {self._session:g}s is refused by {describe(self._cluster)}"
            f" for the group of ktm processes (broker: {allowed or 'limits not described'}); "
            "set it within the broker's limits (the default, 6s, is a stock broker's minimum)"
        )

    def _poll(self, timeout: float) -> None:
        consumer = self._consumer
        if internals.join_dropped(consumer):
            # its outcome is lost; without a new join the member would wait for it for good
            log.debug("a join ended between two polls; joining again")
            internals.request_rejoin(consumer)
        if not internals.joining(consumer):
            records = consumer.poll(timeout_ms=int(timeout * 1000))
            if records:  # never: the assignor assigns no Kafka partition
                log.error("membership consumer received records: %s", list(records))
        if internals.joining(consumer):
            # sent by this poll (the rebalance listener may have spent its time) or out since
            # an earlier one: wait for it at once, leaving no gap for it to end unseen
            internals.await_join(consumer, JOIN_POLL)
            if internals.joining(consumer):
                return  # still out: the next poll waits for it again
        if self._assignor.stale:
            self._assignor.stale = False
            internals.request_rejoin(consumer)

    def last_heartbeat(self) -> float:
        """When the coordinator last answered a heartbeat of this member (monotonic clock;
        -inf while it is not a stable member). Not kafka-python's `last_reset`: that one also
        moves when a frozen member wakes up and merely finds its coordinator again, before it
        learns that it was expelled."""
        return internals.last_heartbeat(self._consumer)

    def close(self) -> None:
        """Leave the group now, so the others need not wait for the session to expire."""
        if not self._closed:
            self._closed = True
            began = time.monotonic()
            if internals.joining(self._consumer):
                # A LeaveGroup while the broker holds this member's join (a new group's first
                # join is held ~3 s) leaves Tansu's group waiting for a leader that is gone, for
                # good (seen: a process that stopped on a config error right after joining
                # early). Apache Kafka copes; the join's end is waited for either way.
                internals.await_join(self._consumer, HELD_JOIN_WAIT)
            self._consumer.close(autocommit=False, timeout_ms=5000)
            log.debug("left the group in %.1fs", time.monotonic() - began)
