"""ktm compact: merge small segments into big ones, partitions in parallel as one Spark job
(relay.engine.batch)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from relay.config import Config
from relay.engine.batch import BatchPipeline
from relay.engine.driver.task_plan import Load, plan_tasks
from relay.errors import RelayError
from relay.pipelines.compact.executor import compact_partitions
from relay.pipelines.compact.spec import CompactResult, CompactTask
from relay.store.configured import store_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompactOptions:
    level: int = 0
    min_age: float = 3600.0
    delete: bool = False


class CompactPipeline(BatchPipeline[CompactTask, CompactResult, CompactResult]):
    """The partitions of every [topics] key, planned over the slots; the results added up."""

    kind = "compact"
    run = staticmethod(compact_partitions)

    def __init__(self, cfg: Config, options: CompactOptions):
        self.cfg, self.options = cfg, options

    def tasks(self, slots: int) -> Sequence[CompactTask]:
        store_cfg = self.cfg.need_store()
        store = store_of(store_cfg)
        store.check()
        keys = [
            (route.source, partition)
            for route in self.cfg.topics
            for partition in store.list_partitions(store_cfg.cluster, route.source)
        ]
        if not keys:
            log.info("nothing to compact: no segments of the [topics] in %s", store.describe())
            return []
        options = self.options
        return [
            CompactTask(
                store=store_cfg,
                partitions=group,
                level=options.level,
                min_age=options.min_age,
                target_bytes=store_cfg.max_segment_bytes * store_cfg.compact_factor,
                delete=options.delete,
            )
            for group in plan_tasks([Load(key, 0) for key in keys], slots)
        ]

    def total(self, results: list[CompactResult]) -> CompactResult:
        total = CompactResult(
            sum(r.merged for r in results),
            sum(r.inputs for r in results),
            sum(r.deleted for r in results),
            sum(r.records for r in results),
            tuple(e for r in results for e in r.errors),
        )
        if total.errors:
            more = f" (and {len(total.errors) - 1} more)" if len(total.errors) > 1 else ""
            raise RelayError(f"compaction failed: {total.errors[0]}{more}")
        return total
