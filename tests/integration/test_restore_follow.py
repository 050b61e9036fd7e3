"""`ktm restore --follow` as the far side of a mirror through a store: started before the first
segment exists, it waits (and says so), then restores every record once as segments land."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from typing import Any

import pytest

from testbed.ktm_process import Ktm, assert_one_error_line, metric_total, run_ktm, wait_for
from testbed.ports import free_port
from testbed.records import read_all, record_count
from testbed.topics import create_topic, unique_topic
from tests.integration.test_backup_restore import assert_same, config
from tests.support.feeder import Feeder

pytestmark = [pytest.mark.timeout(300), pytest.mark.brokers("tansu", "kafka")]

PARTITIONS = 4
# Segments close quickly and the restore lists the store often: the test waits for seconds.
STORE_KEYS = 'max_segment_records = 500\nmax_segment_age = "1s"\nfollow_interval = "300ms"'


def healthz(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as exc:
        return dict(json.loads(exc.read()))
    except OSError:
        return None


def waiting(port: int) -> dict[str, str]:
    return dict((healthz(port) or {}).get("waiting") or {})


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
def test_backup_and_restore_follow_started_together_on_an_empty_store(
    source_broker, target_broker, tmp_path
):
    src = create_topic(source_broker.bootstrap, unique_topic("fol"), PARTITIONS)
    dst = unique_topic("fol-copy")  # created by the restore (--create-topics)
    store = tmp_path / "store"
    restore_port, backup_port = free_port(), free_port()
    restore_conf, backup_conf = (
        config(
            tmp_path / name,
            source=source_broker.bootstrap,
            target=target_broker.bootstrap,
            topics={src: dst},
            store=str(store),
            store_keys=STORE_KEYS,
            app=f'metrics_addr = "127.0.0.1:{port}"',
        )  # fmt: skip
        for name, port in (("r.toml", restore_port), ("b.toml", backup_port))
    )
    flags = ("--no-progress",)
    with Ktm(tmp_path, "--config", str(restore_conf), "--follow", "--create-topics", *flags,
             command="restore") as restore:  # fmt: skip
        wait_for(lambda: src in waiting(restore_port), 120, "restore waiting in /healthz", restore)
        feeder = Feeder(source_broker.bootstrap, src, PARTITIONS)
        with Ktm(tmp_path, "--config", str(backup_conf), *flags, command="backup") as backup:
            try:

                def restored() -> float:
                    return metric_total(restore_port, "ktm_messages_produced_total") or 0

                wait_for(lambda: restored() >= 2_000, 120, "records restored", restore)
            finally:
                sent = feeder.stop()
            wait_for(
                lambda: record_count(target_broker.bootstrap, dst) >= sent,
                120,
                "all restored",
                restore,
            )
            assert not waiting(restore_port) or all(
                reason == "a late segment" for reason in waiting(restore_port).values()
            )
            backup.proc.send_signal(signal.SIGTERM)
            backed_up = backup.wait(timeout=60)
        restore.proc.send_signal(signal.SIGTERM)
        restored_run = restore.wait(timeout=60)
    assert backed_up.returncode == 0, backed_up.stderr
    assert restored_run.returncode == 0, restored_run.stderr
    assert f"waiting for the first segment of topic {src}" in restored_run.stderr
    assert_same(read_all(source_broker.bootstrap, src), read_all(target_broker.bootstrap, dst))


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
def test_restore_follow_into_an_existing_topic_waits_per_partition(
    source_broker, target_broker, tmp_path
):
    """The destination exists: its partitions stand in for the store's, each waits for its
    first segment (the metric and /healthz say so), and a stop while waiting exits 0."""
    src = create_topic(source_broker.bootstrap, unique_topic("fol-empty"), 2)  # for `check`
    dst = create_topic(target_broker.bootstrap, unique_topic("fol-empty-copy"), 2)
    port = free_port()
    conf = config(tmp_path / "c.toml", source=source_broker.bootstrap,
                  target=target_broker.bootstrap, topics={src: dst}, store=str(tmp_path / "s"),
                  store_keys=STORE_KEYS, app=f'metrics_addr = "127.0.0.1:{port}"')  # fmt: skip
    with Ktm(tmp_path, "--config", str(conf), "--follow", "--no-progress",
             command="restore") as restore:  # fmt: skip
        wait_for(lambda: len(waiting(port)) == 2, 120, "both partitions waiting", restore)
        assert set(waiting(port)) == {f"{src}[0]", f"{src}[1]"}
        assert (healthz(port) or {}).get("status") == "ok"
        wait_for(lambda: (metric_total(port, "ktm_restore_waiting_seconds") or 0) > 0, 30,
                 "waiting seconds exported", restore)  # fmt: skip
        restore.proc.send_signal(signal.SIGTERM)
        run = restore.wait(timeout=60)
    assert run.returncode == 0, run.stderr

    without_follow = run_ktm(tmp_path, "--config", str(conf), command="restore", timeout=120)
    assert_one_error_line(without_follow, 1, f"[topics].{src}: no segments of topic", "--follow")
    check = run_ktm(tmp_path, "--config", str(conf), command="check", timeout=120)
    assert f"{src}: no segments yet; ktm restore --follow waits for them" in check.stdout
