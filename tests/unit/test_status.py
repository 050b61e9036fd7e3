"""Progress bookkeeping, /healthz decisions and the progress views, without brokers."""

from __future__ import annotations

from rich.console import Console

from relay.engine.driver.progress import eta, plain_line, render
from relay.engine.driver.status import Status
from relay.engine.metrics import Metrics
from relay.engine.pipeline import NodeView
from relay.spec import PartitionProgress, PartitionRoute
from tests.support.clock import Clock

ROUTES = [
    PartitionRoute("orders", 0, "orders-copy", 0),
    PartitionRoute("orders", 1, "orders-copy", 1),
]


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


def progress(partition: int, nxt: int, **kw) -> PartitionProgress:
    return PartitionProgress(key=("orders", partition), next_offset=nxt, **kw)


def test_reports_update_counts_lag_and_metrics() -> None:
    status, clock, metrics = make_status()
    clock.now += 2.0
    status.apply(
        (1, 0, 0),
        [progress(0, 60, consumed=60, produced=50, filtered=(("pii", 10),), highwater=120)],
        latencies=(0.2, 0.3),
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


def test_cumulative_reports_count_once_even_when_repeated() -> None:
    status, _, metrics = make_status()
    status.apply((1, 0, 0), [progress(0, 10, consumed=10, produced=10)])
    status.apply((1, 0, 0), [progress(0, 30, consumed=30, produced=30)])
    # the same totals again (the final report, then the Spark result): nothing new
    status.apply((1, 0, 0), [progress(0, 30, consumed=30, produced=30)])
    # Spark retried the task (a lost executor): a new attempt counts from zero
    status.apply((1, 0, 1), [progress(0, 35, consumed=5, produced=5)])
    assert status.snapshot().relayed == 35
    labels = {
        "source_topic": "orders",
        "source_partition": "0",
        "target_topic": "orders-copy",
        "target_partition": "0",
    }
    assert metrics.registry.get_sample_value("ktm_messages_produced_total", labels) == 35
    assert status.next_offsets()[("orders", 0)] == 35


def test_rounds_are_counted_by_reason() -> None:
    status, _, metrics = make_status()
    status.record_round(12.0, "rebalance")
    status.record_round(3.0, "stop")
    assert status.rounds == 2
    value = metrics.registry.get_sample_value("ktm_rounds_total", {"reason": "rebalance"})
    assert value == 1
    assert metrics.registry.get_sample_value("ktm_round_duration_seconds_sum") == 15.0


def test_skipped_filter_errors_are_counted_apart() -> None:
    status, _, metrics = make_status()
    status.apply((1, 0, 0), [progress(0, 5, filtered=(("pii", 2),), filter_errors=(("pii", 2),))])
    labels = {"filter": "pii", "source_topic": "orders"}
    assert metrics.registry.get_sample_value("ktm_filter_errors_total", labels) == 2
    assert metrics.registry.get_sample_value("ktm_messages_filtered_total", labels) == 2


def test_health_is_ok_while_progressing_and_when_idle_at_the_end() -> None:
    status, clock, _ = make_status()
    clock.now += 30
    assert status.health()[0]
    status.apply((1, 0, 0), [progress(0, 100, produced=100)])
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
    status, _, metrics = make_status()
    status.observe_nodes([NodeView("dc1", True, {("orders", 1): 40})], "dc1")
    assert status.snapshot().rows[1].lag == 30
    lag = {"source_topic": "orders", "source_partition": "1"}
    assert metrics.registry.get_sample_value("ktm_partition_lag", lag) == 30.0
    status.observe_nodes([NodeView("dc1", True, {("orders", 1): 35})], "dc1")  # an older answer
    assert status.snapshot().rows[1].lag == 30
    status.observe_nodes([NodeView("dc1", True, {("orders", 1): 45})], "dc1")
    assert metrics.registry.get_sample_value("ktm_partition_lag", lag) == 35.0


def test_plain_line_and_eta_for_stop_at_end() -> None:
    status, clock, _ = make_status(stops={("orders", 0): 100, ("orders", 1): 10})
    clock.now += 2.0
    status.apply((1, 0, 0), [progress(0, 50, produced=50)])
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
    status, clock, _ = make_status(stops={("orders", 0): 100, ("orders", 1): 10})
    clock.now += 2.0
    status.apply((1, 0, 0), [progress(0, 50, produced=50)])
    console = Console(record=True, width=120, force_terminal=True)
    console.print(render(status.snapshot()))
    text = console.export_text()
    assert "source: dc1" in text
    assert "orders-copy[0]" in text and "orders-copy[1]" in text
    assert "50 / 100 records to the end offsets, ETA 2s" in text


def test_resume_points_only_move_forward() -> None:
    status, _, _ = make_status()
    assert status.advance(("orders", 0), 40)
    assert not status.advance(("orders", 0), 30)  # the destination never moves a point back
    assert status.next_offsets()[("orders", 0)] == 40


def test_a_following_restore_waiting_for_segments_is_healthy_and_visible() -> None:
    status, clock, metrics = make_status()
    # start-up still waits for this topic's first segment
    status.waiting_topics = {"payments": "its first segment"}
    status.apply((1, 0, 0), [progress(0, 0, waiting=("empty", 4.0)), progress(1, 10)])
    ok, detail = status.health()
    assert ok
    assert detail["waiting"] == {"payments": "its first segment", "orders[0]": "its first segment"}
    labels = {"source_topic": "orders", "source_partition": "0", "reason": "empty"}
    assert metrics.registry.get_sample_value("ktm_restore_waiting_seconds", labels) == 4.0
    assert "waiting_for_segments=1" in plain_line(status.snapshot())

    clock.now += 1.0  # the segment landed: the wait ends, its series reads 0
    status.waiting_topics = {}
    status.apply((1, 0, 0), [progress(0, 5, produced=5)])
    assert "waiting" not in status.health()[1]
    assert metrics.registry.get_sample_value("ktm_restore_waiting_seconds", labels) == 0.0


def test_a_hole_pins_the_partition_until_records_past_it_are_acknowledged() -> None:
    status, _, metrics = make_status()
    status.apply((1, 0, 0), [progress(0, 40, produced=40, hole=True)])
    assert not status.advance(("orders", 0), 90)  # the destination's tail is past the hole
    assert status.next_offsets()[("orders", 0)] == 40
    labels = {"source_topic": "orders", "source_partition": "0"}
    assert metrics.registry.get_sample_value("ktm_destination_holes_total", labels) == 1.0

    status.apply((2, 0, 0), [progress(0, 40)])  # the next round starts at the hole
    assert not status.advance(("orders", 0), 90)
    status.apply((2, 0, 0), [progress(0, 45, produced=5)])  # relayed past it again
    assert status.advance(("orders", 0), 90)


def test_lag_and_next_offset_are_published_for_owned_partitions_only() -> None:
    status, _, metrics = make_status()
    lag = {"source_topic": "orders", "source_partition": "1"}
    assert metrics.registry.get_sample_value("ktm_partition_lag", lag) == 0.0
    status.set_owned(frozenset({("orders", 0)}), members=2)  # partition 1 went to another member
    status.apply((1, 0, 0), [progress(0, 50, produced=50), progress(1, 10)])
    assert metrics.registry.get_sample_value("ktm_partition_lag", lag) is None
    assert metrics.registry.get_sample_value("ktm_source_next_offset", lag) is None
    owned = {"source_topic": "orders", "source_partition": "0"}
    assert metrics.registry.get_sample_value("ktm_partition_lag", owned) == 50.0
    status.set_owned(frozenset({("orders", 0), ("orders", 1)}), members=1)  # and came back
    assert metrics.registry.get_sample_value("ktm_source_next_offset", lag) == 10.0


def test_a_partition_that_stops_moving_plans_with_no_rate() -> None:
    status, clock, _ = make_status()
    clock.now += 2.0
    status.apply((1, 0, 0), [progress(0, 60, consumed=60, produced=60)])
    assert status.rows()[("orders", 0)].rate == 30.0
    clock.now += 10.0  # no report of it since: live reports leave out what did not move
    assert status.rows()[("orders", 0)].rate == 0.0
    assert status.snapshot().rows[0].rate == 0.0


def test_a_failed_tasks_runs_that_landed_count_and_a_refused_one_is_never_passed() -> None:
    """A failed task's last report names its unacknowledged runs (first offset, records, what
    became of them). The resync after it counts the runs the destination's tail shows landed,
    and a run the broker refused (or never got) with the tail past it is a hole: the partition
    resumes there, not after the tail (issue 35: 2,107 records lost on a rolling restart)."""
    from relay.spec import ACKED, NOT_WRITTEN, UNKNOWN

    status, _, metrics = make_status()
    runs = ((10, 5, ACKED), (15, 5, UNKNOWN), (20, 5, UNKNOWN))
    status.apply((1, 0, 0), [progress(0, 10, produced=10, unsure=runs)])
    assert status.advance(("orders", 0), 20, ours=True)  # 10-19 landed; 20-24 did not
    assert status.snapshot().relayed == 20

    status.apply((2, 0, 0), [progress(0, 20)])
    runs = ((20, 5, NOT_WRITTEN), (25, 5, UNKNOWN), (30, 5, ACKED))
    status.apply((2, 0, 0), [progress(0, 20, unsure=runs)])
    assert not status.advance(("orders", 0), 35, ours=True)  # the tail is past 20-24: a hole
    assert status.next_offsets()[("orders", 0)] == 20
    labels = {"source_topic": "orders", "source_partition": "0"}
    assert metrics.registry.get_sample_value("ktm_destination_holes_total", labels) == 1.0

    status.apply((3, 0, 0), [progress(0, 20, unsure=((20, 5, UNKNOWN),))])
    assert status.advance(("orders", 0), 25, ours=False)  # a takeover counts nothing
    assert status.snapshot().relayed == 20
