"""Restored copies the destination will delete (relay.retention): records in the store older
than a destination topic's `retention.ms`, from each partition's resume point, within the
restore's `--from-time`/`--until-time` window. Segments wholly older than the cutoff count from
their metadata; only a segment straddling it, or the window's edges, is read."""

from __future__ import annotations

from collections.abc import Mapping

from relay.retention import AtRisk, by_topic
from relay.spec import PartitionRoute, SourcePartition
from relay.store import ChainLink, SegmentStore, plan_chain


def stored_at_risk(
    store: SegmentStore,
    cluster: str,
    routes: list[PartitionRoute],
    nexts: Mapping[SourcePartition, int],
    retention: Mapping[str, int | None],
    now_ms: int,
    window: tuple[int | None, int | None] = (None, None),
) -> list[AtRisk]:
    counts = {}
    for route in routes:
        keep = retention.get(route.target_topic)
        if keep is not None and route.key in nexts:
            cutoff = now_ms - keep
            counts[route.key] = _older(store, cluster, route, nexts[route.key], cutoff, window)
    return by_topic(routes, counts, retention)


def _older(
    store: SegmentStore,
    cluster: str,
    route: PartitionRoute,
    start: int,
    cutoff: int,
    window: tuple[int | None, int | None],
) -> int:
    """Records of the partition's chain from `start`, in the window, stamped before `cutoff`."""
    since, until = window
    refs = store.list_segments(cluster, route.topic, route.partition)
    metas = {ref.path: store.read_meta(ref) for ref in refs}
    count = 0
    for link in plan_chain([ChainLink.of(ref, metas[ref.path]) for ref in refs]).links:
        meta = metas.get(link.key)
        if meta is None or link.ref is None or link.next_offset <= start:
            continue
        if meta.min_timestamp >= cutoff or (since is not None and meta.max_timestamp < since):
            continue
        whole = meta.first >= start and meta.max_timestamp < cutoff
        if whole and (since is None or meta.min_timestamp >= since) and until is None:
            count += meta.count
            continue
        count += sum(
            1
            for r in store.read_records(link.ref)
            if r.offset >= start
            and r.timestamp < cutoff
            and (since is None or r.timestamp >= since)
            and (until is None or r.timestamp < until)
        )
    return count
