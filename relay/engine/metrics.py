"""Every Prometheus metric ktm exports (the HTTP server for /metrics and /healthz is
relay.engine.metrics_server).

Metrics are declared here only. The registry is passed in, so tests use a fresh one.
Executors do not touch metrics: tasks report counts and the driver records them.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

# relay.pipelines.verify.follow imports the server from here

ROUTE_LABELS = ("source_topic", "source_partition", "target_topic", "target_partition")
ALL_PARTITIONS = "*"  # the partition label of a per-topic series ([app].partition_metrics)

# Counters' `_created` series (a timestamp per series) say nothing ktm's rules or dashboard use,
# and double what a scrape carries: 10,000 partitions cost 64k lines and 7.3 MB with them.
disable_created_metrics()


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, per_partition: bool = True):
        self.registry = registry or CollectorRegistry()
        # [app].partition_metrics = false: one series per topic, partition label "*"
        self.per_partition = per_partition
        r = self.registry
        self._record_metrics(r)
        self._source_metrics(r)
        self._pace_metrics(r)
        self._round_metrics(r)
        self._error_metrics(r)
        self._partition_fate_metrics(r)
        self._discovery_metrics(r)
        self._group_metrics(r)
        self._acl_and_config_metrics(r)
        self._verify_metrics(r)

    def _record_metrics(self, r: CollectorRegistry) -> None:
        """Records read, written and filtered, and what they weigh."""
        self.consumed = Counter(
            "ktm_messages_consumed", "Records read from the source", ROUTE_LABELS, registry=r
        )
        self.produced = Counter(
            "ktm_messages_produced",
            "Records acknowledged by the destination",
            ROUTE_LABELS,
            registry=r,
        )
        self.filtered = Counter(
            "ktm_messages_filtered",
            "Records dropped by a filter",
            ("filter", "source_topic"),
            registry=r,
        )
        self.filter_errors = Counter(
            "ktm_filter_errors",
            'Records a filter raised on, dropped because of on_error = "skip"',
            ("filter", "source_topic"),
            registry=r,
        )
        self.bytes_produced = Counter(
            "ktm_bytes_produced",
            "Bytes produced: records before compression (relay), keys and values (restore), "
            "segments (backup)",
            ("target_topic",),
            registry=r,
        )
        self.segments_written = Counter(
            "ktm_segments_written",
            "Segments ktm backup wrote to the store (their bytes: ktm_bytes_produced_total)",
            ("source_topic", "source_partition"),
            registry=r,
        )

    def _source_metrics(self, r: CollectorRegistry) -> None:
        """The source nodes: their health, the active one, the fetches from them."""
        self.node_up = Gauge(
            "ktm_source_node_up",
            "1 if the source node answered its last health check",
            ("node",),
            registry=r,
        )
        self.node_end_offset = Gauge(
            "ktm_source_node_end_offset",
            "End offset per partition seen by the health check",
            ("node", "topic", "partition"),
            registry=r,
        )
        self.active_node = Gauge(
            "ktm_active_node", "1 for the source node being relayed from", ("node",), registry=r
        )
        self.failovers = Counter(
            "ktm_failovers",
            "Switches of the active source node",
            ("from_node", "to_node", "reason"),
            registry=r,
        )
        self.fetch_failures = Counter(
            "ktm_fetch_failures",
            "Fetches from a source broker that failed or timed out (the tasks retry them)",
            ("node",),
            registry=r,
        )
        self.fetch_waiting = Gauge(
            "ktm_fetch_waiting_seconds",
            "How long the oldest fetch out to a source broker has waited for its answer",
            ("node",),
            registry=r,
        )

    def _pace_metrics(self, r: CollectorRegistry) -> None:
        """How far behind the copy is, and what holds it back ([limits])."""
        self.lag = Gauge(
            "ktm_partition_lag",
            "Source end offset minus the next offset to relay",
            ("source_topic", "source_partition"),
            registry=r,
        )
        self.next_offset = Gauge(
            "ktm_source_next_offset",
            "First source offset not yet acknowledged by the destination",
            ("source_topic", "source_partition"),
            registry=r,
        )
        self.first_record = Gauge(
            "ktm_first_record_seconds",
            "Seconds from start to the first record acknowledged by the destination",
            registry=r,
        )
        self.latency = Histogram(
            "ktm_replication_latency_seconds",
            "Destination ack time minus the record's source timestamp (sampled per fetch)",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.limit = Gauge(
            "ktm_limit",
            "This process's share of [limits] (per second; 0: no limit)",
            ("kind",),  # records, bytes
            registry=r,
        )
        self.throttled = Counter(
            "ktm_throttled_seconds",
            "Time the tasks held back their reads to stay within [limits]",
            registry=r,
        )

    def _round_metrics(self, r: CollectorRegistry) -> None:
        """Rounds, the Spark slots they run in, and this process's share of the group."""
        self.round_duration = Histogram(
            "ktm_round_duration_seconds",
            "Wall time of one round (one Spark job whose tasks run until the driver stops them)",
            buckets=(1, 5, 15, 60, 300, 900, 3600, 6 * 3600, 24 * 3600),
            registry=r,
        )
        self.rounds = Counter(
            "ktm_rounds",
            "Rounds ended, by reason: end, stop, rebalance, failover, error, membership, lost, "
            "new partitions, cancelled (the Spark job cancelled), failed (the Spark job failed)",
            ("reason",),
            registry=r,
        )
        self.round_gap = Counter(
            "ktm_round_gap_seconds",
            "Time between rounds: from a round's stop request until every task of the next "
            "round reported (records wait this long)",
            registry=r,
        )
        self.task_slots = Gauge(
            "ktm_task_slots", "Spark task slots the relay runs its tasks in", registry=r
        )
        self.assigned_partitions = Gauge(
            "ktm_assigned_partitions",
            "Source partitions this process owns in its group (the others relay the rest)",
            registry=r,
        )
        self.group_members = Gauge(
            "ktm_group_members", "ktm processes in this process's group", registry=r
        )
        self.rebalances = Counter(
            "ktm_rebalances", "Group rebalances this process stopped its work for", registry=r
        )

    def _error_metrics(self, r: CollectorRegistry) -> None:
        """Errors, and the retries after them."""
        self.errors = Counter("ktm_errors", "Errors by kind", ("kind",), registry=r)
        self.retries = Counter(
            "ktm_retries", "Retries after a retriable error", ("side",), registry=r
        )
        self.produce_retries = Counter(
            "ktm_produce_retries",
            "Epochs re-run after the destination failed (unacknowledged records produced again)",
            registry=r,
        )

    def _partition_fate_metrics(self, r: CollectorRegistry) -> None:
        """Partitions that cannot go on as they were: holes, halts, lost records, waits."""
        self.holes = Counter(
            "ktm_destination_holes",
            "Failed batches followed by acknowledged ones (a hole at the destination): the "
            "partition was relayed again from the first failed record",
            ("source_topic", "source_partition"),
            registry=r,
        )
        self.halted = Gauge(
            "ktm_partitions_halted",
            "Source partitions not relayed any more because the destination refuses one of their "
            "records for good (a timestamp out of its limits, a null key for a compacted topic) "
            "or lacks their partition (a source topic grown past it), or the source lost records "
            "before they were copied; 1 per halted partition (per topic: how many)",
            ("source_topic", "source_partition"),
            registry=r,
        )
        self.records_lost = Counter(
            "ktm_source_records_lost",
            "Source offsets lost to the copy: deleted at the source (retention, DeleteRecords) "
            "before they were read, or truncated below what was copied (an unclean leader "
            "election, a topic recreated)",
            ("source_topic", "source_partition", "cause"),
            registry=r,
        )
        self.restore_waiting = Gauge(
            "ktm_restore_waiting_seconds",
            "restore --follow: seconds a partition has waited for a segment (reason empty: its "
            "first one; late: one missing between two others); 0 when not waiting",
            ("source_topic", "source_partition", "reason"),
            registry=r,
        )

    def _discovery_metrics(self, r: CollectorRegistry) -> None:
        """Topics and partitions found while running ([discover])."""
        self.topics_created = Counter(
            "ktm_topics_created", "Destination topics ktm created", registry=r
        )
        self.partitions_found = Counter(
            "ktm_partitions_discovered",
            "Source partitions found while running (new topics, added partitions)",
            registry=r,
        )

    def _group_metrics(self, r: CollectorRegistry) -> None:
        """Consumer groups carried over ([groups])."""
        self.groups_synced = Gauge(
            "ktm_groups_synced",
            "Consumer groups whose last sync translated every partition they committed",
            registry=r,
        )
        self.group_sync_time = Gauge(
            "ktm_group_sync_timestamp_seconds",
            "Unix time at which the source offsets of a group's last complete sync were read: a "
            "consumer stopped on the source before it may start on the target",
            ("group",),
            registry=r,
        )
        self.group_sync_age = Gauge(
            "ktm_group_sync_age_seconds",
            "Seconds since the source offsets of a group's last complete sync were read",
            ("group",),
            registry=r,
        )
        self.group_trailing = Gauge(
            "ktm_group_offset_trailing",
            "Records of the destination partition after a group's translated offset",
            ("group", "target_topic", "target_partition"),
            registry=r,
        )
        self.group_active = Gauge(
            "ktm_group_active_on_target",
            "1 while a carried group is active on the target, either protocol (ktm then "
            "commits nothing for it)",
            ("group",),
            registry=r,
        )

    def _acl_and_config_metrics(self, r: CollectorRegistry) -> None:
        """Topic ACLs copied ([acls]) and topic configs kept in step ([target].config_sync)."""
        self.acls_created = Counter(
            "ktm_acls_created",
            "Topic ACLs ktm created on the target, copied from the source",
            registry=r,
        )
        self.acl_failures = Counter(
            "ktm_acl_failures", "Topic ACLs the target refused to create", registry=r
        )
        self.topic_configs_altered = Counter(
            "ktm_topic_configs_altered",
            "Configs of destination topics set or deleted to keep them in step with the source",
            registry=r,
        )
        self.topic_config_failures = Counter(
            "ktm_topic_config_failures",
            "Config changes of destination topics the target refused",
            registry=r,
        )

    def _verify_metrics(self, r: CollectorRegistry) -> None:
        """`ktm verify --follow`: how far each source partition's copy is proven exact."""
        labels = ("source_topic", "source_partition")
        self.verified_next = Gauge(
            "ktm_verified_next_offset",
            "First source offset not verified yet: every record before it was found exactly once "
            "in the copy (or rightly absent), or counted in ktm_verify_mismatches_total",
            labels,
            registry=r,
        )
        self.verify_mismatches = Counter(
            "ktm_verify_mismatches",
            "Records of the copy found to differ from the source, by kind (missing, duplicated, "
            "different:<field>, out_of_order, unexpected)",
            (*labels, "kind"),
            registry=r,
        )
        self.verified = Counter(
            "ktm_verified_records",
            "Records of the copy compared with the source",
            labels,
            registry=r,
        )
        self.verify_age = Gauge(
            "ktm_verify_age_seconds",
            "Seconds since the last verify pass ended (copy: relay, backup or restore)",
            ("copy",),
            registry=r,
        )


def partition_label(metrics: Metrics, partition: int) -> str:
    """A partition's label value: its number, or "*" when series are kept per topic."""
    return str(partition) if metrics.per_partition else ALL_PARTITIONS


def per_topic(values: Mapping[tuple[str, int], float]) -> dict[tuple[str, int | str], float]:
    """Per-partition values summed per topic: {(topic, "*"): sum}."""
    sums: dict[tuple[str, int | str], float] = {}
    for (topic, _), value in values.items():
        sums[(topic, ALL_PARTITIONS)] = sums.get((topic, ALL_PARTITIONS), 0) + value
    return sums
