"""kafka-python's consumers, groups, admin client and metadata (relay.internals)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from relay.internals.missing import Missing, attr

if TYPE_CHECKING:  # kafka-python's own classes (untyped: they say what each argument is)
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
    from kafka.cluster import ClusterMetadata

log = logging.getLogger(__name__)


def position(consumer: KafkaConsumer, tp: TopicPartition) -> int | None:
    """A partition's next offset from the consumer's subscription state, without the round trip
    `KafkaConsumer.position()` may make; None if it is not known there."""
    state = attr(consumer, "_subscription", "KafkaConsumer._subscription").assignment.get(tp)
    found = getattr(state, "position", None)
    return None if found is None else int(found.offset)


def request_rejoin(consumer: KafkaConsumer) -> None:
    """Make this member rejoin its group (with new metadata) without leaving it."""
    coordinator = attr(consumer, "_coordinator", "KafkaConsumer._coordinator")
    attr(coordinator, "request_rejoin", "ConsumerCoordinator.request_rejoin")()


def joining(consumer: KafkaConsumer) -> bool:
    """This member's JoinGroup/SyncGroup exchange is on the wire (False once it ended).

    kafka-python 3.0.12 keeps that exchange as a task across polls, but when it completes
    after one poll gave up waiting and before the next one looks, the next one finds it done,
    drops its outcome and sends a new JoinGroup: one more rebalance (3 s more at Tansu, a new
    generation for every member on Kafka), seen in 1 start of 5 on a busy driver. A caller
    that knows a join is out can wait for it longer (`await_join`)."""
    task = _join_task(consumer)
    return task is not None and not task.is_done


def join_dropped(consumer: KafkaConsumer) -> bool:
    """This member's last JoinGroup/SyncGroup exchange ended after the poll that sent it gave
    up waiting, and no poll took its outcome (kafka-python clears the task when one does).

    kafka-python takes an exchange's outcome only while a poll awaits it. A later poll that
    finds it done sends a new JoinGroup if the member still needs to rejoin, and otherwise does
    nothing, for good: the heartbeat stays off, the assignment is never delivered, and the
    coordinator expels the member. That happens when the rejoin was for a subscribed topic's
    new partition: the leader's assignment itself clears that need (seen on a loaded CI
    machine, where the rebalance listener had spent the poll's time)."""
    task = _join_task(consumer)
    return task is not None and bool(task.is_done)


def _join_task(consumer: KafkaConsumer) -> Any:
    """kafka-python's task of the JoinGroup/SyncGroup exchange; None when no poll left one."""
    coordinator = attr(consumer, "_coordinator", "KafkaConsumer._coordinator")
    return attr(coordinator, "_join_task", "BaseCoordinator._join_task")


def await_join(consumer: KafkaConsumer, timeout: float) -> None:
    """Wait up to `timeout` seconds for the join that is out, returning as soon as it ends
    (with its callbacks run, as in a poll): a consumer's poll, given no partition to fetch,
    waits out its whole timeout even after the join ended.

    kafka-python waits only while the member needs to rejoin, and a leader's own assignment can
    clear that need before the exchange ends (`join_dropped`): the need is marked again first,
    which the exchange's end clears."""
    coordinator = attr(consumer, "_coordinator", "KafkaConsumer._coordinator")
    ensure = attr(coordinator, "ensure_active_group", "ConsumerCoordinator.ensure_active_group")
    if joining(consumer):
        request_rejoin(consumer)
    ensure(timeout_ms=int(timeout * 1000))


def find_coordinator_soon(consumer: KafkaConsumer, timeout: float) -> None:
    """Start finding the consumer's group coordinator and connecting to it (a node of its own
    in kafka-python) on the consumer's IO thread, and return at once: the group's first commit
    then waits one round trip instead of three (FindCoordinator, the new connection's
    ApiVersions, the OffsetCommit). A commit that comes first shares the lookup."""
    coordinator = attr(consumer, "_coordinator", "KafkaConsumer._coordinator")
    manager = attr(consumer, "_manager", "KafkaConsumer._manager")

    async def find() -> None:
        try:
            if await coordinator.ensure_coordinator_ready_async(timeout_ms=int(timeout * 1000)):
                node = coordinator.coordinator()
                if node is not None:
                    manager.get_connection(node)  # connects on the IO thread
        except Exception as exc:  # noqa: BLE001 - nobody waits: the commit meets it again
            log.debug("finding the group coordinator: %s", exc)

    manager.call_soon(find)


def last_heartbeat(consumer: KafkaConsumer) -> float:
    """When the coordinator last answered this member's heartbeat (monotonic), -inf while the
    member is not stable in its group."""
    coordinator = attr(consumer, "_coordinator", "KafkaConsumer._coordinator")
    if not coordinator.stable():
        return float("-inf")
    heartbeat = attr(coordinator, "heartbeat", "ConsumerCoordinator.heartbeat")
    return float(attr(heartbeat, "last_receive", "Heartbeat.last_receive"))


def group_member_count(admin: KafkaAdminClient, group: str) -> int:
    """Members of a consumer group, from DescribeGroups read without kafka-python's decoding of
    the authorized operations (which fails on brokers that answer a value it does not know:
    Tansu does)."""
    find = attr(admin, "_find_coordinator_ids", "KafkaAdminClient._find_coordinator_ids")
    build = attr(admin, "_describe_groups_request", "KafkaAdminClient._describe_groups_request")
    manager = attr(admin, "_manager", "KafkaAdminClient._manager")

    async def describe(_: KafkaAdminClient) -> int:
        coordinators = await find([group])
        response = await manager.send(build([group]), node_id=coordinators[group])
        return sum(len(described.members) for described in response.groups)

    return int(manager.run(describe, admin))


def metadata_config(client: object) -> dict[str, object]:
    """The config dict a client's cluster metadata reads (`allow_auto_create_topics`)."""
    cluster = getattr(client, "_metadata", None)  # a producer's
    if cluster is None:  # a consumer's or an admin client's
        cluster = getattr(getattr(client, "_manager", None), "cluster", None)
    config = getattr(cluster, "config", None)
    if not isinstance(config, dict) or "allow_auto_create_topics" not in config:
        raise Missing("ClusterMetadata.config['allow_auto_create_topics']")
    return config


def client_cluster(client: object) -> ClusterMetadata:
    """The cluster metadata of a kafka-python consumer or network client (both keep their
    connection manager as `_manager`)."""
    manager = attr(client, "_manager", "KafkaNetClient._manager")
    return attr(manager, "cluster", "KafkaConnectionManager.cluster")


def api_versions(client: object) -> tuple[tuple[int, int, int], ...]:
    """(api key, min, max) of each API the client's bootstrap broker offered; () before its
    bootstrap."""
    manager = attr(client, "_manager", "KafkaNetClient._manager")
    data = attr(manager, "broker_version_data", "KafkaConnectionManager.broker_version_data")
    if data is None:
        return ()
    return tuple(sorted((int(key), low, high) for key, (low, high) in data.api_versions.items()))


def know_api_versions(client: object, versions: tuple[tuple[int, int, int], ...]) -> None:
    """Tell a client (not yet bootstrapped) the API versions its bootstrap would have found:
    the requests it builds pick their versions from them, and a consumer that has them skips
    its eager bootstrap. Every connection still asks its broker (ApiVersions) and goes no
    higher than that broker offers."""
    if not versions:
        return
    from kafka.protocol.broker_version_data import BrokerVersionData

    manager = attr(client, "_manager", "KafkaNetClient._manager")
    attr(manager, "broker_version_data", "KafkaConnectionManager.broker_version_data")
    manager.broker_version_data = BrokerVersionData(
        api_versions={key: (low, high) for key, low, high in versions}
    )


OFFSET_FOR_LEADER_EPOCH = 23  # the API key

LogEnds = dict["TopicPartition", tuple[int, int]]  # (leader epoch, log end)


def log_ends_soon(
    consumer: KafkaConsumer, parts: list[TopicPartition], timeout: float
) -> Callable[[], LogEnds]:
    """Ask each partition's leader its log end now (OffsetForLeaderEpoch for its current
    epoch, what a consumer asks to find a truncation: unlike ListOffsets and fetches, it counts
    the records appended and not committed yet); the call returned waits for the answers, so
    the caller's other requests go meanwhile (a round trip less across a long link).

    Left out: a partition whose leader did not answer or answered an error, and one whose
    leader the consumer's metadata does not know (refreshing it is the caller's: a consumer
    with no subscription refreshes no topic). {} when the brokers do not offer the request
    (Tansu: one node, nothing waits for a follower)."""
    manager = attr(consumer, "_manager", "KafkaConsumer._manager")
    versions = attr(manager, "broker_version_data", "KafkaConnectionManager.broker_version_data")
    if versions is None or OFFSET_FOR_LEADER_EPOCH not in versions.api_versions:
        return dict
    cluster = attr(manager, "cluster", "KafkaConnectionManager.cluster")
    timeout_ms = int(timeout * 1000)

    async def ask(_: KafkaConsumer) -> LogEnds:
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in parts:
            leader, epoch = cluster.leader_for_partition(tp), cluster.leader_epoch_for_partition(tp)
            if leader is not None and leader >= 0 and epoch is not None and epoch >= 0:
                by_leader.setdefault(leader, []).append(tp)
        sent = [
            manager.send(_epoch_request(cluster, tps), node_id=node, request_timeout_ms=timeout_ms)
            for node, tps in by_leader.items()
        ]
        found: LogEnds = {}
        for future in sent:
            try:
                found.update(_ends_in(await future))
            except Exception as exc:  # noqa: BLE001 - left out: the caller asks again
                log.debug("OffsetForLeaderEpoch: %s", exc)
        return found

    answer = manager.call_soon(ask, consumer)
    return lambda: dict(manager.run(manager.wait_for, answer, timeout_ms + 1000))


def _epoch_request(cluster: ClusterMetadata, asked: list[TopicPartition]) -> object:
    from kafka.protocol.consumer import OffsetForLeaderEpochRequest

    part = OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition
    by_topic: dict[str, list[object]] = {}
    for tp in asked:
        epoch = cluster.leader_epoch_for_partition(tp)
        by_topic.setdefault(tp.topic, []).append(
            part(partition=tp.partition, current_leader_epoch=epoch, leader_epoch=epoch)
        )
    return OffsetForLeaderEpochRequest(replica_id=-1, topics=list(by_topic.items()))


def _ends_in(response: object) -> LogEnds:
    from kafka import TopicPartition

    return {
        TopicPartition(topic.topic, part.partition): (part.leader_epoch, part.end_offset)
        for topic in getattr(response, "topics", ())
        for part in topic.partitions
        if part.error_code == 0 and part.end_offset >= 0
    }
