"""Progress bookkeeping, /healthz decisions and the progress views, without brokers."""

from __future__ import annotations

from rich.console import Console

from relay.failover import NodeView
from relay.metrics import Metrics
from relay.plan import PartitionRoute, TaskResult
from relay.progress import eta, plain_line, render
from relay.status import Status

ROUTES = [
    PartitionRoute("orders", 0, "orders-copy", 0),
    PartitionRoute("orders", 1, "orders-copy", 1),
]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_status(stops: dict | None = None) -> tuple[Status, Clock, Metrics]:
    clock, metrics = Clock(), Metrics()
    status = Status(metrics, stuck_after=60, clock=clock)
    status.active_node = "dc1"
    status.start(
        ROUTES,
        {("orders", 0): 0, ("orders", 1): 10},
        {("orders", 0): 100, ("orders", 1): 10},
        stops,
    )
    return status, clock, metrics


def result(partition: int, start: int, nxt: int, **kw) -> TaskResult:
    return TaskResult(key=("orders", partition), start=start, next_offset=nxt, elapsed=2.0, **kw)


def test_epoch_results_update_counts_lag_and_metrics() -> None:
    status, _, metrics = make_status()
    status.record_epoch(
        [
            result(
                0,
                0,
                60,
                consumed=60,
                produced=50,
                filtered={"pii": 10},
                highwater=120,
                latencies=(0.2, 0.3),
            )
        ],
        wall=2.5,
    )
    snap = status.snapshot()
    assert (snap.relayed, snap.filtered, snap.lag) == (50, 10, 60)
    assert snap.rows[0].rate == 25.0
    labels = {
        "source_topic": "orders",
        "source_partition": "0",
        "target_topic": "orders-copy",
        "target_partition": "0",
    }
    assert metrics.registry.get_sample_value("ktm_messages_produced_total", labels) == 50
    assert metrics.registry.get_sample_value("ktm_messages_consumed_total", labels) == 60
    assert (
        metrics.registry.get_sample_value(
            "ktm_messages_filtered_total", {"filter": "pii", "source_topic": "orders"}
        )
        == 10
    )
    assert (
        metrics.registry.get_sample_value(
            "ktm_partition_lag", {"source_topic": "orders", "source_partition": "0"}
        )
        == 60
    )
    assert metrics.registry.get_sample_value("ktm_replication_latency_seconds_count") == 2
    assert metrics.registry.get_sample_value("ktm_epoch_overhead_seconds_total") == 0.5


def test_skipped_filter_errors_are_counted_apart() -> None:
    status, _, metrics = make_status()
    status.record_epoch([result(0, 0, 5, filtered={"pii:error": 2})], wall=2.0)
    labels = {"filter": "pii", "source_topic": "orders"}
    assert metrics.registry.get_sample_value("ktm_filter_errors_total", labels) == 2
    assert metrics.registry.get_sample_value("ktm_messages_filtered_total", labels) == 2


def test_health_is_ok_while_progressing_and_when_idle_at_the_end() -> None:
    status, clock, _ = make_status()
    clock.now += 30
    assert status.health()[0]
    status.record_epoch([result(0, 0, 100, produced=100)], wall=2.0)
    clock.now += 3600  # no lag left: idle at the end is healthy
    ok, detail = status.health()
    assert ok and detail["lag"] == 0


def test_health_is_503_when_stuck_with_lag() -> None:
    status, clock, _ = make_status()
    clock.now += 61
    ok, detail = status.health()
    assert not ok and "no progress for 61s with lag 100" in str(detail["reason"])


def test_health_is_503_when_no_source_node_answers() -> None:
    status, _, _ = make_status()
    status.observe_nodes([NodeView("dc1", False, error="KafkaTimeoutError: boom")], "dc1")
    ok, detail = status.health()
    assert (
        not ok
        and "no source node reachable" in str(detail["reason"])
        and "dc1" in str(detail["reason"])
    )


def test_health_checks_keep_lag_current() -> None:
    status, _, _ = make_status()
    status.observe_nodes([NodeView("dc1", True, {("orders", 1): 40})], "dc1")
    assert status.snapshot().rows[1].lag == 30


def test_plain_line_and_eta_for_stop_at_end() -> None:
    status, _, _ = make_status(stops={("orders", 0): 100, ("orders", 1): 10})
    status.record_epoch([result(0, 0, 50, produced=50)], wall=2.0)
    snap = status.snapshot()
    assert snap.remaining == 50 and eta(snap) == 2.0
    line = plain_line(snap)
    assert (
        "relayed=50" in line
        and "remaining=50" in line
        and "eta=2s" in line
        and "active=dc1" in line
    )


def test_the_live_table_renders_every_partition_and_the_bar() -> None:
    status, _, _ = make_status(stops={("orders", 0): 100, ("orders", 1): 10})
    status.record_epoch([result(0, 0, 50, produced=50)], wall=2.0)
    console = Console(record=True, width=120, force_terminal=True)
    console.print(render(status.snapshot()))
    text = console.export_text()
    assert "active node: dc1" in text
    assert "orders-copy[0]" in text and "orders-copy[1]" in text
    assert "50 / 100 records to the end offsets, ETA 2s" in text


def test_resume_points_only_move_forward() -> None:
    status, _, _ = make_status()
    assert status.advance(("orders", 0), 40)
    assert not status.advance(("orders", 0), 30)  # the destination never moves a point back
    assert status.next_offsets()[("orders", 0)] == 40
