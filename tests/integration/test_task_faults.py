"""A task that stops answering: its round is cancelled after the stop timeout, and the relay
goes on with a new round, losing and repeating nothing (issue 35: a cancelled round crashed ktm
with "Counters can only be incremented by non-negative amounts")."""

from __future__ import annotations

import json
import os
import signal

import pytest

from testbed.ktm_process import Ktm, metric_total, spark_workers, wait_for
from testbed.ports import free_port
from testbed.records import Record, produce, read_all
from tests.support.relay import assert_exact_copy, topic_pair, write_config

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 4
RECORDS = 8_000
CAP = 1_000  # records/s for the whole relay: it is still running when its tasks freeze


def test_a_frozen_task_is_cancelled_and_a_new_round_copies_exactly_once(
    source_broker, target_broker, tmp_path
):
    src, dst = topic_pair(source_broker.bootstrap, target_broker.bootstrap, "frozen-task",
                          PARTITIONS)  # fmt: skip
    backlog = [Record(value=b"%08d" % i, partition=i % PARTITIONS) for i in range(RECORDS)]
    produce(source_broker.bootstrap, src, backlog)
    port = free_port()
    conf = write_config(tmp_path / "c.toml", source=source_broker.bootstrap,
                        target=target_broker.bootstrap, topics={src: dst},
                        app=f'metrics_addr = "127.0.0.1:{port}"',
                        extra=f"\n[limits]\nrecords_per_second = {CAP}\n")  # fmt: skip
    summary = tmp_path / "summary.json"
    args = ("--config", str(conf), "--stop-at-end", "--no-progress", "--summary-json", str(summary))
    with Ktm(tmp_path, *args) as relay:

        def relayed() -> float:
            return metric_total(port, "ktm_messages_produced_total") or 0

        wait_for(lambda: relayed() > 2_000, 60, "records flowing", relay)
        frozen = spark_workers(relay.proc.pid)
        assert frozen, "no Spark Python worker found"
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:  # silent for 8 s: asked to stop; 15 s later the Spark job is cancelled
            wait_for(lambda: "cancelling the Spark job" in relay.stderr(), 90, "the cancel", relay)
        finally:
            for pid in frozen:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        run = relay.wait(timeout=150)
    assert run.returncode == 0, run.stderr
    assert "internal error" not in run.stderr
    copied = [r for rs in read_all(target_broker.bootstrap, dst).values() for r in rs]
    assert_exact_copy(read_all(source_broker.bootstrap, src), copied, src)
    done = json.loads(summary.read_text())
    assert done["rounds"] >= 2  # the cancelled one and the next
    assert run.stderr.count("went silent") == 1  # said once, not at every check
    print(f"\nrelayed {done['relayed']} of {RECORDS}, rounds {done['rounds']}")
    assert done["relayed"] == RECORDS
