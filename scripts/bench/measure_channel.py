"""How running tasks tell the driver their progress: the two honest options, measured.

A. Tasks commit their source group's offsets as they go, and the driver polls them
   (OffsetCommit per task per interval, one OffsetFetch per poll, both against the source).
B. Each task reports over a small TCP channel to the driver (relay.engine.channel), which answers
   with a lease and can say "stop".

For each: how stale the driver's view is (from a task's update to the driver seeing it), and
what it costs the brokers (requests per second). ktm uses B; A gives progress only, no "stop".
"""

from __future__ import annotations

import random
import statistics
import threading
import time

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from relay.engine.channel import ChannelClient, ControlServer, Report
from relay.spec import PartitionProgress, TaskResult
from scripts.bench import report
from scripts.bench.contenders import Bench, unique
from scripts.bench.options import Options
from scripts.bench.report import Table
from testbed.topics import create_topic

TASKS = 2
PARTITIONS_PER_TASK = 24
UPDATES = 40  # per task
COMMIT_INTERVAL = 1.0  # option A: a task commits about once a second (kafka-python's default 5s)
POLL_INTERVAL = 0.5  # option A: the driver polls twice a second
REPORT_INTERVAL = 0.5  # option B: ktm's report interval


def channel(bench: Bench, opts: Options) -> Table:
    table = Table(
        f"PROGRESS CHANNEL: {TASKS} tasks x {PARTITIONS_PER_TASK} partitions, {UPDATES} updates "
        "per task",
        ["option", "staleness p50 ms", "staleness max ms", "broker requests/s", "can say stop"],
    )
    a = _commits_and_polls(bench.cluster.src)
    b = _channel_reports()
    table.add("A: commit offsets, driver polls", *_cells(a[0]), f"{a[1]:.1f}", "no")
    table.add("B: TCP channel to the driver", *_cells(b), "0", "yes (and a lease)")
    table.notes.append(
        f"staleness: from a task's update to the driver seeing it. A: commits every "
        f"{COMMIT_INTERVAL:g}s, polls every {POLL_INTERVAL:g}s; B: a report every "
        f"{REPORT_INTERVAL:g}s, seen on arrival. Requests counted against the source broker."
    )
    return table


def _cells(samples: list[float]) -> tuple[str, str]:
    if not samples:
        return report.NA, report.NA
    return f"{statistics.median(samples) * 1000:.0f}", f"{max(samples) * 1000:.0f}"


def _commits_and_polls(bootstrap: str) -> tuple[list[float], float]:
    """Option A: tasks commit a rising offset; the driver polls the group's offsets."""
    group = unique("channel-a")
    topic = create_topic(bootstrap, unique("channel-topic"), PARTITIONS_PER_TASK)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS_PER_TASK)]
    committed_at: dict[int, float] = {}
    seen: list[float] = []
    requests = [0]
    done = threading.Event()

    def task(index: int) -> None:
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
        try:
            for n in range(1, UPDATES // 2 + 1):
                value = n * 1000 + index
                consumer.commit({tp: OffsetAndMetadata(value, "", -1) for tp in tps})
                committed_at[value] = time.monotonic()
                requests[0] += 1
                # Jitter: tasks and the poller are not in step on a real cluster either.
                time.sleep(COMMIT_INTERVAL * random.uniform(0.8, 1.2))
        finally:
            consumer.close(autocommit=False)

    threads = [threading.Thread(target=task, args=(i,)) for i in range(TASKS)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    last = None
    try:
        while any(t.is_alive() for t in threads):
            offsets = admin.list_group_offsets(group).get(group, {})
            requests[0] += 1
            value = max((meta.offset for meta in offsets.values()), default=None)
            if value is not None and value != last and value in committed_at:
                seen.append(time.monotonic() - committed_at[value])
                last = value
            time.sleep(POLL_INTERVAL)
    finally:
        done.set()
        admin.close()
    return seen, requests[0] / (time.monotonic() - began)


def _channel_reports() -> list[float]:
    """Option B: tasks report over the channel; the driver sees each report on arrival."""
    sent_at: dict[tuple[int, int], float] = {}
    seen: list[float] = []

    def on_report(rep: Report) -> None:
        key = (rep.task_id, rep.result.partitions[0].produced)
        if key in sent_at:
            seen.append(time.monotonic() - sent_at[key])

    server = ControlServer("127.0.0.1", 0, "token", lambda _: 5.0, on_report)
    clients = [ChannelClient(server.address, {"round": 1, "task": i, "attempt": 0, "pid": 0})
               for i in range(TASKS)]  # fmt: skip
    try:
        for n in range(1, UPDATES + 1):
            for i, client in enumerate(clients):
                parts = tuple(PartitionProgress(("t", p), n, produced=n)
                              for p in range(PARTITIONS_PER_TASK))  # fmt: skip
                sent_at[(i, n)] = time.monotonic()
                client.report(TaskResult(1, i, 0, parts))
            time.sleep(REPORT_INTERVAL / 10)  # faster than ktm: many samples in little time
    finally:
        for client in clients:
            client.close()
        server.close()
    return seen
