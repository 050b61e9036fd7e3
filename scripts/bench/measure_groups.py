"""The groups section: what carrying consumer groups over (`[groups]`, issue 20) costs the
driver, per sync.

A source topic of P partitions is relayed by `ktm relay --stop-at-end`; G consumer groups then
commit a random offset on K partitions each of it on the source (`--groups-cases G:P:K`; group i
on partitions i*K.. modulo P: with K = P every group on every partition). The relay's group
sync (relay.pipelines.relay.group_sync.GroupSync, the driver-side code as it runs, here in this
process against the bench's brokers) translates and commits them three times: every translation
searched (the first sync), no group moved (the cached copies serve), every group moved again.
Each sync is checked: every committed target offset must be the destination offset of the first
copy at or after the source offset (compared with a full read of the destination).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from relay.clients.admin import offset_bounds
from relay.clients.kept import keep_clients
from relay.config import load_config
from relay.engine.metrics import Metrics
from relay.pipelines.relay.group_sync import GroupSync
from relay.pipelines.relay.relayed import Relayed
from relay.spec import PartitionRoute
from scripts.bench import report
from scripts.bench.contenders import Bench, Ktm, servers, unique
from scripts.bench.data import dataset, topic_on
from scripts.bench.measure_copy import run_timeout
from scripts.bench.options import Options
from scripts.bench.report import Table
from testbed.provenance import attributed


def groups(bench: Bench, opts: Options) -> Table:
    records = opts.records[0]
    table = Table(
        f"GROUP SYNC: {records:,} records relayed",
        ["groups", "partitions", "per group", "sync", "wall s", "driver CPU s",
         "ms per group-partition", "committed", "check"],
    )  # fmt: skip
    for case in opts.groups_cases:
        _case(bench, records, opts.size, case, table)
    table.notes.append(
        "one sync of every group, driver side (ListGroups, OffsetFetch, the searches over "
        "destination batches, DescribeGroups and OffsetCommit per group); CPU: this thread's"
    )
    return table


def _case(bench: Bench, records: int, size: int, case: tuple[int, int, int], table: Table) -> None:
    count, partitions, per_group = case
    print(f"\n[groups] {count} groups on {per_group} of {partitions} partitions each")
    cluster = bench.cluster
    with (
        dataset(cluster, partitions, records, size) as data,
        topic_on(cluster.dst, "bench-dst", partitions) as dest,
    ):
        with Ktm(bench, data.topic, dest, stop_at_end=True) as relay:
            finished = relay.wait(run_timeout(records))
        if finished.returncode != 0:
            raise RuntimeError(f"ktm relay exited {finished.returncode}")
        copies = _first_copies(cluster.dst, dest, partitions)
        names = [unique("bench-group") for _ in range(count)]
        own = {name: [(i * per_group + k) % partitions for k in range(per_group)]
               for i, name in enumerate(names)}  # fmt: skip
        syncer, ends = _syncer(bench, data.topic, dest, names, partitions)
        committed: dict[str, dict[int, int]] = {name: {} for name in names}
        for label, move in (("first", True), ("no group moved", False), ("all moved", True)):
            if move:
                committed = _commit_forward(cluster.src, data.topic, committed, ends, own)
            began, cpu = time.monotonic(), time.thread_time()
            with keep_clients():  # as the relay's sync thread does
                results = syncer.translate(commit=True)
            wall, used = time.monotonic() - began, time.thread_time() - cpu
            check = _check(cluster.dst, dest, names, committed, copies)
            per = wall * 1000 / (count * per_group)
            done = sum(r.committed for r in results)
            cells = (report.decimal(wall, 2), report.decimal(used, 2), report.decimal(per, 1))
            table.add(count, partitions, per_group, label, *cells, str(done), check)


def _syncer(
    bench: Bench, source: str, dest: str, names: list[str], partitions: int
) -> tuple[GroupSync, dict[int, int]]:
    """The sync, and the source's end offsets (where the relay, run to the end, stands)."""
    config = bench.workdir / f"{unique('groups')}.toml"
    include = ", ".join(f'"{name}"' for name in names)
    config.write_text(
        f'[app]\nmetrics_addr = ""\n\n[topics]\n"{source}" = "{dest}"\n\n'
        f'[[sources]]\nname = "src"\nservers = {servers(bench.cluster.src)}\n\n'
        f"[target]\nservers = {servers(bench.cluster.dst)}\n\n[groups]\ninclude = [{include}]\n"
    )
    cfg = load_config(Path(config))
    routes = [PartitionRoute(source, p, dest, p) for p in range(partitions)]
    _, found = offset_bounds(cfg.sources[0], [r.key for r in routes], 30.0)
    progress = dict(found)
    syncer = GroupSync(cfg, Relayed.fixed(cfg.sources[0], routes, progress), Metrics())
    return syncer, {p: end for (_, p), end in found.items()}


def _commit_forward(
    bootstrap: str,
    topic: str,
    before: dict[str, dict[int, int]],
    ends: dict[int, int],
    own: dict[str, list[int]],
) -> dict[str, dict[int, int]]:
    """Each group commits a random offset on each of its partitions, at or after its previous
    one (a target group is never moved backwards, so neither is a real consumer's)."""
    committed: dict[str, dict[int, int]] = {}
    for name, previous in before.items():
        offsets = {p: random.randint(previous.get(p, 0), ends[p]) for p in own[name]}
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=name)
        consumer.commit({TopicPartition(topic, p): OffsetAndMetadata(o, "", -1)
                         for p, o in offsets.items()})  # fmt: skip
        consumer.close(autocommit=False)
        committed[name] = offsets
    return committed


def _first_copies(bootstrap: str, dest: str, partitions: int) -> dict[int, list[tuple[int, int]]]:
    """(source offset, destination offset) of every copy, per partition, by a full read."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(dest, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        records: list = []
        quiet = 0
        while quiet < 4:
            got = consumer.poll(timeout_ms=500, max_records=100_000)
            quiet = 0 if got else quiet + 1
            records.extend(r for rs in got.values() for r in rs)
        records.sort(key=lambda r: (r.partition, r.offset))
        pairs: dict[int, list[tuple[int, int]]] = {p: [] for p in range(partitions)}
        for copy, record in zip(attributed(records), records, strict=True):
            pairs[record.partition].append((copy.offset, record.offset))
        return pairs
    finally:
        consumer.close()


def _check(bootstrap: str, dest: str, names: list[str], committed: dict[str, dict[int, int]],
           copies: dict[int, list[tuple[int, int]]]) -> str:  # fmt: skip
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        found = admin.list_group_offsets({name: None for name in names})
    finally:
        admin.close()
    for name in names:
        on_target = {tp.partition: m.offset for tp, m in found.get(name, {}).items()}
        for p, source_offset in committed[name].items():
            pairs = copies[p]
            end = pairs[-1][1] + 1 if pairs else 0
            want = next((d for s, d in pairs if s >= source_offset), end)
            if on_target.get(p) != want:
                return f"WRONG {name}[{p}]: {on_target.get(p)} != {want}"
    return "ok"
