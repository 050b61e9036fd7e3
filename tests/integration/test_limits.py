"""[limits]: a backfill under a records/s cap takes the time the cap implies, and records
written to another topic meanwhile still flow. A real ktm process, real brokers; the timing is
read from the relay's own /metrics."""

from __future__ import annotations

import signal
import time

import pytest

from testbed.ktm_process import Ktm, metric_total, wait_for
from testbed.ports import free_port
from testbed.records import Record, produce, read_all
from testbed.topics import create_topic, unique_topic
from tests.support.feeder import Feeder
from tests.support.relay import assert_exact_copy, write_config

pytestmark = [pytest.mark.timeout(300), pytest.mark.brokers("tansu", "kafka")]

BACKFILL = 100_000
CAP = 10_000  # records/s for the whole group: the backfill takes 10 s


def produced_to(port: int, topic: str) -> float:
    """ktm_messages_produced_total summed over one destination topic (0 before /metrics is up)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            text = answer.read().decode()
    except OSError:
        return 0.0
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "ktm_messages_produced_total"
        and sample.labels.get("target_topic") == topic
    )


@pytest.mark.brokers("kafka")  # ktm's own behaviour, the same on any broker: the cap
def test_a_capped_backfill_takes_the_time_the_cap_implies_and_live_records_still_flow(
    source_broker, target_broker, tmp_path
):
    backfill = create_topic(source_broker.bootstrap, unique_topic("fill"), 4)
    live = create_topic(source_broker.bootstrap, unique_topic("live"), 1)
    fill_copy = create_topic(target_broker.bootstrap, unique_topic("fill-copy"), 4)
    live_copy = create_topic(target_broker.bootstrap, unique_topic("live-copy"), 1)
    records = [Record(value=b"%08d" % i + b"." * 92, partition=i % 4) for i in range(BACKFILL)]
    produce(source_broker.bootstrap, backfill, records)
    port = free_port()
    conf = write_config(
        tmp_path / "c.toml", source=source_broker.bootstrap, target=target_broker.bootstrap,
        topics={backfill: fill_copy, live: live_copy}, app=f'metrics_addr = "127.0.0.1:{port}"',
        extra=f"\n[limits]\nrecords_per_second = {CAP}\n",
    )  # fmt: skip
    feeder = None
    try:
        with Ktm(tmp_path, "--config", str(conf), "--no-progress") as relay:
            wait_for(lambda: produced_to(port, fill_copy) > 0, 120, "the backfill started", relay)
            began = time.monotonic()
            feeder = Feeder(source_broker.bootstrap, live, 1, per_batch=5, pause=0.25)
            wait_for(lambda: produced_to(port, live_copy) >= 20, 60, "live records", relay)
            live_seen = produced_to(port, fill_copy)
            wait_for(lambda: produced_to(port, fill_copy) >= BACKFILL, 120, "the backfill", relay)
            took = time.monotonic() - began
            assert metric_total(port, "ktm_limit") == CAP  # this process: all the partitions
            assert (metric_total(port, "ktm_throttled_seconds_total") or 0) > 1
            sent = feeder.stop()
            wait_for(lambda: produced_to(port, live_copy) >= sent, 60, "the live records", relay)
            relay.proc.send_signal(signal.SIGTERM)
            ended = relay.wait(60)
    finally:
        if feeder is not None:
            feeder.stop()
    assert ended.returncode == 0, ended.stderr[-3000:]
    expected = BACKFILL / CAP
    assert abs(took - expected) <= 0.1 * expected, f"{BACKFILL} records took {took:.1f}s"
    assert live_seen < BACKFILL, "live records arrived only after the backfill"
    copies = read_all(target_broker.bootstrap, fill_copy)
    assert_exact_copy(read_all(source_broker.bootstrap, backfill),
                      [r for rs in copies.values() for r in rs], backfill)  # fmt: skip
