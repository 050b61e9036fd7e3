"""ktm restore --groups: carry consumer-group offsets over to the target, translated.

Backup snapshots the committed offsets of `[store].groups`. For each restored partition, a
group's committed source offset c becomes the destination offset of the first restored record
whose source offset is >= c (`relay.provenance.translation`: the provenance header says which
record is which), so the group's consumers resume exactly where they were: no record skipped,
none read twice.

With "topic" = "dest:N" several source partitions share a destination partition: the group
gets the smallest of their translations (it may read a few records again, never skip one).
"""

from __future__ import annotations

import logging
from collections import Counter

from relay.clients import consumer_groups
from relay.config import Config
from relay.provenance.translation import first_copy_at_or_after
from relay.spec import PartitionRoute
from relay.store import group_snapshot_path
from relay.store.configured import store_of

log = logging.getLogger(__name__)


def carry_groups(cfg: Config, routes: list[PartitionRoute], timeout: float) -> list[str]:
    """Commit every snapshotted group's translated offsets on the target; one line per group."""
    store_cfg, target = cfg.need_store(), cfg.need_target().cluster
    store = store_of(store_cfg)
    lines = []
    feeders = Counter((r.target_topic, r.target_partition) for r in routes)
    for group in store.list_groups(store_cfg.cluster):
        snapshot = store.read_json(group_snapshot_path(store_cfg.cluster, group)) or {}
        offsets = snapshot.get("offsets", {})
        translated: dict[tuple[str, int], int] = {}
        for route in routes:
            committed = offsets.get(route.topic, {}).get(str(route.partition))
            if committed is None:
                continue
            dest = (route.target_topic, route.target_partition)
            found = first_copy_at_or_after(
                target, dest, route.key, int(committed), timeout, sole=feeders[dest] == 1
            )
            translated[dest] = min(found, translated.get(dest, found))
        if translated:
            consumer_groups.commit_group(target, group, translated, timeout)
        line = f"group {group}: {len(translated)} partition offset(s) committed on the target"
        log.info("%s", line)
        lines.append(line)
    return lines
