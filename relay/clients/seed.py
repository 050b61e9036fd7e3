"""A source cluster's metadata, read by the driver and handed to the workers with their tasks.

kafka-python bootstraps every client it makes: a connection to a bootstrap broker, ApiVersions,
a Metadata request, that connection closed; only then the leader's connection (ApiVersions
again) and the first real request. Two of those round trips buy what the driver already knows
from start-up: the brokers, the topics' leaders and epochs, and the broker's API versions.
Across a 240 ms link that is half a second at every start, for the worker's fetcher and its
consumer (the source group's commits) alike.

A `Seed` is that knowledge as plain picklable data, built from one of the driver's clients of
the same node (`seed_of`). A worker's client made with it (`seeded`) knows its leaders and
its API versions at once: its first request goes to the leader as soon as that connection is
up, and a consumer skips its eager bootstrap. Nothing else changes: kafka-python still
bootstraps once in the background (its metadata refresh loop starts with one) and refreshes
as it would; a seed gone stale (a leader moved, a broker gone) is what a leader move is to any
client: the request fails retriably, the metadata is asked again. A seed of another cluster
than the client's (its `servers` differ) is not used.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from kafka import TopicPartition
from kafka.cluster import ClusterMetadata
from kafka.protocol.metadata import MetadataResponse

from relay import internals

log = logging.getLogger(__name__)

T = TypeVar("T")

_VERSION = 12  # a Metadata answer with leader epochs and topic ids (what update_metadata reads)
_NO_OPERATIONS = -(2**31)  # authorized operations not asked for

Broker = tuple[int, str, int, str | None]  # node id, host, port, rack
Partition = tuple[int, int, int]  # partition, leader, leader epoch
Topic = tuple[str, str | None, tuple[Partition, ...]]  # name, topic id, partitions


@dataclass(frozen=True)
class Seed:
    servers: tuple[str, ...]  # the cluster's `servers` it was read from
    brokers: tuple[Broker, ...]
    cluster_id: str | None
    controller_id: int
    topics: tuple[Topic, ...]
    api_versions: tuple[tuple[int, int, int], ...]  # (api key, min, max) the broker answered

    def of(self, topics: Iterable[str]) -> Seed | None:
        """This seed cut down to `topics` (a task's), None unless it knows them all."""
        wanted = set(topics)
        kept = tuple(t for t in self.topics if t[0] in wanted)
        if len(kept) < len(wanted):
            return None
        return dataclasses.replace(self, topics=kept)

    def response(self) -> MetadataResponse:
        """The Metadata answer the worker's client would have asked for."""
        broker = MetadataResponse.MetadataResponseBroker
        topic = MetadataResponse.MetadataResponseTopic
        partition = topic.MetadataResponsePartition
        return MetadataResponse(
            version=_VERSION,
            throttle_time_ms=0,
            brokers=[
                broker(node_id=n, host=h, port=p, rack=r, version=_VERSION)
                for n, h, p, r in self.brokers
            ],
            cluster_id=self.cluster_id,
            controller_id=self.controller_id,
            topics=[
                topic(
                    error_code=0,
                    name=name,
                    topic_id=uuid.UUID(topic_id) if topic_id else None,
                    is_internal=False,
                    partitions=[
                        partition(
                            error_code=0,
                            partition_index=index,
                            leader_id=leader,
                            leader_epoch=epoch,
                            replica_nodes=[leader],  # only the leader is read from
                            isr_nodes=[leader],
                            offline_replicas=[],
                            version=_VERSION,
                        )
                        for index, leader, epoch in parts
                    ],
                    authorized_operations=_NO_OPERATIONS,
                    version=_VERSION,
                )
                for name, topic_id, parts in self.topics
            ],
        )


def seed_of(client: object, servers: tuple[str, ...], topics: Iterable[str]) -> Seed | None:
    """What `client` (a kafka-python consumer or network client, bootstrapped) knows of
    `topics`; None when it does not know them all, or not their leaders."""
    try:
        cluster = internals.client_cluster(client)
        versions = internals.api_versions(client)
    except internals.Missing as exc:
        log.debug("reading a client's metadata: %s", exc)
        return None
    found = [_topic(cluster, name) for name in sorted(set(topics))]
    if any(topic is None for topic in found):
        return None
    controller = cluster.controller
    return Seed(
        servers=servers,
        brokers=tuple((b.node_id, b.host, b.port, b.rack) for b in cluster.brokers()),
        cluster_id=cluster.cluster_id,
        controller_id=controller.node_id if controller is not None else -1,
        topics=tuple(topic for topic in found if topic is not None),
        api_versions=versions,
    )


def _topic(cluster: ClusterMetadata, name: str) -> Topic | None:
    """A topic as `cluster` knows it; None without its partitions or any partition's leader."""
    parts = cluster.partitions_for_topic(name)
    if not parts:
        return None
    described: list[Partition] = []
    for index in sorted(parts):
        tp = TopicPartition(name, index)
        leader = cluster.leader_for_partition(tp)
        if leader is None or leader < 0:
            return None
        epoch = cluster.leader_epoch_for_partition(tp)
        described.append((index, leader, -1 if epoch is None else epoch))
    topic_id = cluster.topic_id(name)
    return name, str(topic_id) if topic_id else None, tuple(described)


def seeded(client: T, seed: Seed | None, servers: tuple[str, ...]) -> T:
    """`client` (a kafka-python network client, not yet used) told what `seed` knows, if the
    seed is of its cluster. Returns the client."""
    if seed is None or seed.servers != servers:
        return client
    try:
        cluster = internals.client_cluster(client)
        # the topics followed from now on (a later refresh asks for them), then their metadata
        cluster.set_topics([name for name, _, _ in seed.topics])
        cluster.update_metadata(seed.response())
        internals.know_api_versions(client, seed.api_versions)
        log.debug("seeded a client of %s: %d topics", ",".join(servers), len(seed.topics))
    except internals.Missing as exc:
        log.debug("seeding a client's metadata: %s", exc)  # it bootstraps as it always did
    return client
