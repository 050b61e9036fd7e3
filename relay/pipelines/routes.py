"""Routes: which source partition goes to which destination partition.

Pure logic, no Kafka and no Spark: the driver feeds it topic metadata, and it refuses anything
that would lose records (a missing topic, too few destination partitions).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from relay.config import TopicRoute
from relay.errors import KafkaSetupError
from relay.spec import PartitionRoute


def plan_routes(
    routes: Iterable[TopicRoute],
    source_counts: Mapping[str, int],
    target_counts: Mapping[str, int],
    source_name: str,
    target_name: str = "the target",
) -> list[PartitionRoute]:
    """Expand topic routes into partition routes, refusing anything that would lose records."""
    planned: list[PartitionRoute] = []
    for route in routes:
        if route.source not in source_counts:
            raise KafkaSetupError(
                f"{route.where}: source topic {route.source!r} does not exist on {source_name}"
            )
        if route.target not in target_counts:
            raise KafkaSetupError(
                f"{route.where}: destination topic {route.target!r} does not exist on "
                "the target (create it with as many partitions as the source, or set "
                "[target].create_topics = true)"
            )
        n_source, n_target = source_counts[route.source], target_counts[route.target]
        if route.partition is None and n_target < n_source:
            raise KafkaSetupError(
                f"{route.where}: destination {route.target!r} has {n_target} partitions, "
                f"fewer than the source's {n_source}; partition numbers are kept, so add "
                f"partitions ([target].create_topics = true does, where the broker can), or map "
                f'to a fixed one ("{route.target}:N")'
            )
        if route.partition is not None and route.partition >= n_target:
            raise KafkaSetupError(
                f'{route.where}: partition {route.partition} of "{route.target}" does '
                f"not exist (it has {n_target} partitions: 0..{n_target - 1})"
            )
        for p in range(n_source):
            dest = p if route.partition is None else route.partition
            planned.append(PartitionRoute(route.source, p, route.target, dest))
    return planned
