"""Consumer groups, read and written from outside them: their committed offsets (the relay
group's carry each followed topic's incarnation in their metadata: relay.provenance.header),
their members and states, and commits into a group that has no member.

Everything here must be correct for Apache Kafka; Tansu answers DescribeGroups with a value
kafka-python cannot decode, and drops commit metadata.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kafka import TopicPartition
from kafka.errors import (
    FencedMemberEpochError,
    IllegalGenerationError,
    NoError,
    RebalanceInProgressError,
    StaleMemberEpochError,
    UnknownMemberIdError,
)
from kafka.structs import OffsetAndMetadata

from relay import internals
from relay.clients.admin import admin_client
from relay.clients.batch_fetch import TP
from relay.config import ClusterConfig
from relay.provenance.header import marked_incarnation


def committed_offsets(
    cluster: ClusterConfig,
    group_id: str,
    tps: list[TP],
    timeout: float,
    incarnations: Mapping[TP, int] | None = None,
) -> dict[TP, int | None]:
    """A consumer group's committed offset of each partition (None if never): one OffsetFetch
    for the whole group (a request per partition costs seconds with hundreds of them).
    `incarnations`: a commit whose metadata names another incarnation of its topic than the
    one given (relay.provenance.header) is one of a topic since deleted: None."""
    marks = committed_marks(cluster, group_id, timeout)
    found: dict[TP, int | None] = {}
    for tp in tps:
        offset, incarnation = marks.get(tp, (None, 0))
        wanted = incarnation if incarnations is None else incarnations.get(tp, 0)
        found[tp] = offset if incarnation == wanted else None
    return found


def committed_marks(
    cluster: ClusterConfig, group_id: str, timeout: float
) -> dict[TP, tuple[int, int]]:
    """Every committed (offset, incarnation its metadata names) of a group."""
    with admin_client(cluster, timeout) as admin:
        found = admin.list_group_offsets({group_id: None}).get(group_id) or {}
    return {
        (tp.topic, tp.partition): (meta.offset, marked_incarnation(meta.metadata))
        for tp, meta in found.items()
        if meta.offset is not None and meta.offset >= 0
    }


def group_members(cluster: ClusterConfig, group: str, timeout: float) -> int:
    """How many members a consumer group has now (0 when it is empty or unknown).

    DescribeGroups, read without kafka-python's decoding of the authorized operations, which
    fails on brokers that answer a value it does not know (Tansu does)."""

    with admin_client(cluster, timeout) as admin:
        return internals.group_member_count(admin, group)


@dataclass(frozen=True)
class ListedGroup:
    """A consumer group as ListGroups lists it: its type (KIP-848: "classic", "consumer",
    "share", "streams"; from ListGroups v5) and state (v4); "" where the broker says nothing
    (older versions) or "Unknown" (Tansu)."""

    group_id: str
    type: str = ""
    state: str = ""


def listed_groups(cluster: ClusterConfig, timeout: float) -> dict[str, ListedGroup]:
    """The cluster's consumer groups, each with its type and state, from every broker (a
    broker lists the groups it coordinates): one request per broker, whatever the count of
    groups."""
    with admin_client(cluster, timeout) as admin:
        found = admin.list_groups()
    return {
        str(group["group_id"]): ListedGroup(
            str(group["group_id"]),
            str(group.get("group_type") or ""),
            str(group.get("group_state") or ""),
        )
        for group in found
    }


def groups_committed(
    cluster: ClusterConfig, groups: Iterable[str], timeout: float
) -> dict[str, dict[TP, int]]:
    """Every committed offset of each group (partitions it never committed are left out)."""
    wanted = sorted(set(groups))
    if not wanted:
        return {}
    with admin_client(cluster, timeout) as admin:
        found = admin.list_group_offsets({group: None for group in wanted})
    return {
        group: {
            (tp.topic, tp.partition): meta.offset
            for tp, meta in (found.get(group) or {}).items()
            if meta.offset is not None and meta.offset >= 0
        }
        for group in wanted
    }


RETRY_COMMIT = 0.1  # seconds between commits of the partitions a retriable error refused
# What a broker answers a commit made from outside a group (no member id, no generation) while
# the group has members, classic or KIP-848 (UNKNOWN_MEMBER_ID on Apache Kafka 4.4 for both).
MEMBERS_REFUSE = (
    UnknownMemberIdError,
    IllegalGenerationError,
    RebalanceInProgressError,
    StaleMemberEpochError,
    FencedMemberEpochError,
)


class GroupHasMembers(Exception):
    """The broker refused a commit into a group because the group has members now."""


def commit_group(
    cluster: ClusterConfig,
    group: str,
    offsets: dict[TP, int],
    timeout: float,
    marks: Mapping[TP, str] | None = None,
) -> None:
    """Commit offsets for a consumer group (that has no active member) on a cluster, through
    the admin client (kept while a cache is in use): a consumer made for each group cost a
    bootstrap per group, 10 of the 13 s of a sync of 200 groups. GroupHasMembers when the
    broker refuses because the group has members after all (one joined since it was asked)."""
    marks = marks or {}
    commits = {
        TopicPartition(*tp): OffsetAndMetadata(o, marks.get(tp, ""), -1)
        for tp, o in offsets.items()
    }
    deadline = time.monotonic() + timeout
    while True:
        with admin_client(cluster, timeout) as admin:
            answers = admin.alter_group_offsets(group, commits)
        failed = {tp: error for tp, error in answers.items() if error is not NoError}
        if not failed:
            return
        if time.monotonic() > deadline or not all(e.retriable for e in failed.values()):
            break
        commits = {tp: commits[tp] for tp in failed}  # e.g. the coordinator is loading
        time.sleep(RETRY_COMMIT)
    tp = min(failed)
    more = f" (and {len(failed) - 1} more partitions)" if len(failed) > 1 else ""
    what = f"committing group {group} at {tp.topic}[{tp.partition}]{more}"
    if issubclass(failed[tp], MEMBERS_REFUSE):
        raise GroupHasMembers(f"{what}: {failed[tp].__name__}")
    raise failed[tp](what)
