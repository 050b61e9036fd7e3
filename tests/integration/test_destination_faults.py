"""The destination fails batches mid-stream: a frozen target broker (SIGSTOP) makes the records
in flight expire. The partition must not stall behind them (the task ends at once and the round
is retried from where the destination really stands), and every record arrives exactly once
(issue 18.3 and 18.4)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from testbed.ktm_process import Ktm, metric_total, wait_for
from testbed.ports import free_port
from testbed.records import Record, produce, read_all
from testbed.tansu import NO_KILL_REASON, brokers_are_external
from tests.support.feeder import Feeder
from tests.support.relay import (
    FAST_GROUP,
    FAST_RETRIES,
    assert_exact_copy,
    topic_pair,
    write_config,
)

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(brokers_are_external(), reason=NO_KILL_REASON),
]

PARTITIONS = 4
BACKLOG = 20_000  # waiting when ktm starts; a feeder keeps adding while the target is frozen
# Deliveries expire after twice the request timeout (plus linger): 2 s, well within the freeze.
TARGET = (
    'request_timeout = "1s"\nmax_retries = 20\nbackoff_min = "200ms"\nbackoff_max = "1s"\n'
    'batch_size = 1024\nlinger = "0ms"'
)
FREEZE_SECONDS = 5.0
# The target is also the group's coordinator: a session long enough that the 5 s freeze costs
# no lease (renewed while the coordinator answered within half a session), so the tasks see
# the failed deliveries themselves instead of being stopped for lost membership.
SESSION = 'session_timeout = "12s"'


def test_a_target_frozen_mid_stream_fails_batches_and_the_relay_still_copies_exactly_once(
    source_broker, target_broker, tmp_path
):
    src, dst = topic_pair(source_broker.bootstrap, target_broker.bootstrap, "frozen", PARTITIONS)
    backlog = [
        Record(key=b"b%d" % i, value=b"%08d" % i + b"." * 92, partition=i % PARTITIONS)
        for i in range(BACKLOG)
    ]
    produce(source_broker.bootstrap, src, backlog)
    port = free_port()
    conf = write_config(tmp_path / "c.toml", source=source_broker.bootstrap,
                        target=target_broker.bootstrap, topics={src: dst},
                        app=f'metrics_addr = "127.0.0.1:{port}"', extra=TARGET)  # fmt: skip
    head, _, tail = conf.read_text().rpartition(FAST_RETRIES)  # [target]'s: TARGET replaces it
    conf.write_text((head + tail).replace(FAST_GROUP, SESSION))
    feeder = Feeder(source_broker.bootstrap, src, PARTITIONS, per_batch=40, pause=0.02)
    summary = tmp_path / "summary.json"
    with Ktm(
        tmp_path, "--config", str(conf), "--no-progress", "--summary-json", str(summary)
    ) as relay:

        def relayed() -> float:
            return metric_total(port, "ktm_messages_produced_total") or 0

        try:
            wait_for(lambda: relayed() > BACKLOG, 120, "the backlog relayed", relay)
            os.kill(target_broker.pid, signal.SIGSTOP)  # mid-stream: the feeder goes on
            try:
                time.sleep(FREEZE_SECONDS)
            finally:
                os.kill(target_broker.pid, signal.SIGCONT)
            time.sleep(2)  # records keep flowing after the thaw
        finally:
            sent = feeder.stop()
        # the destination's count says when everything arrived (records that landed without
        # an ack are found there by the next round's resync)
        arrived = lambda: sum(map(len, read_all(target_broker.bootstrap, dst).values()))  # noqa: E731
        wait_for(lambda: arrived() >= BACKLOG + sent, 120, "every record relayed", relay)
        relay.proc.send_signal(signal.SIGTERM)
        run = relay.wait(timeout=60)
    assert run.returncode == 0, run.stderr
    assert "did not take" in run.stderr or "no acknowledgement" in run.stderr, run.stderr
    source = read_all(source_broker.bootstrap, src, timeout=30)
    copied = [r for rs in read_all(target_broker.bootstrap, dst, timeout=30).values() for r in rs]
    assert_exact_copy(source, copied, src)
    # what this process relayed, records that landed unacknowledged included
    assert json.loads(summary.read_text())["relayed"] == BACKLOG + sent
