"""The destination producer's two paths (bulk append and per-record send) on a real broker."""

from __future__ import annotations

import pytest

from relay.clients.producer import Producer
from relay.config import ClusterConfig, TargetConfig
from tests.support.kafka import create_topic, read_all, unique_topic

pytestmark = pytest.mark.timeout(60)


def items(count: int) -> list:
    out = []
    for i in range(count):
        key = None if i % 3 == 0 else b"k%d" % i
        value = None if i % 3 == 0 or i % 5 == 0 else b"v" * (i % 300)  # some null/null records
        headers = [("a", b"1"), ("a", b"2")] if i % 2 else []
        out.append((1_700_000_000_000 + i, key, value, headers))
    return out


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "send"])
def test_both_paths_write_the_same_records_and_acknowledge_every_segment(target_broker, bulk):
    topic = create_topic(target_broker.bootstrap, unique_topic("target"), 2)
    # A small batch_size forces the bulk path across several producer batches.
    cfg = TargetConfig(ClusterConfig("target", (target_broker.bootstrap,)), batch_size=2048)
    producer = Producer(cfg, bulk=bulk)
    try:
        wanted = items(700)
        segments = producer.send_batch(topic, 1, wanted[:300]) + producer.send_batch(
            topic, 1, wanted[300:]
        )
        producer.flush(timeout=20)
    finally:
        producer.close()
    assert sum(count for count, _ in segments) == 700
    assert all(future.is_done and future.succeeded() for _, future in segments)
    if bulk:
        assert 1 < len(segments) < 700  # whole batches, not one future per record
    got = read_all(target_broker.bootstrap, topic)[1]
    assert [(r.timestamp, r.key, r.value, list(r.headers)) for r in got] == wanted
