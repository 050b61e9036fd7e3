"""Relays across a long link: the source, or the target, 240 ms away (a US-Asia round trip).

Both brokers of the section sit behind a delaying proxy (testbed/link.py) on loopback; the
data is produced and the copies are checked with the link at 0 ms, and only the contenders' runs
cross it. Every contender copies the same backlog with the same yardstick as the steady section:
the destination's end offsets sampled while it runs, the rate fitted between 20% and 80% of the
records, and the whole process from launch to exit."""

from __future__ import annotations

import functools
from pathlib import Path

from scripts.bench.contenders import Bench, runnable
from scripts.bench.data import dataset
from scripts.bench.measure_copy import STEADY_HEADERS, steady_notes, steady_once, steady_row
from scripts.bench.options import Options
from scripts.bench.report import Table
from testbed.link import FarBroker
from testbed.tansu import BrokerPair

ONE_WAY = 0.12  # seconds each way: a 240 ms round trip
# The confluent loop flushes (and commits) once a second here: flushing every 500 records, as on
# loopback, it would wait a round trip per 500 records (2,000 records/s at most). The naive
# kafka-python loop is left out: it flushes every batch.
LOOP_FLUSH_INTERVAL = 1.0


class LinkedCluster(BrokerPair[FarBroker]):
    """A source and a target broker, each behind its own link (0 ms until told otherwise).
    Tansu whatever --brokers says: testbed.link's proxies front a Tansu broker."""

    kind = "tansu"

    def __init__(self, log_dir: Path):
        source = FarBroker("bench-far-source", log_dir=log_dir)
        super().__init__(source, FarBroker("bench-far-target", log_dir=log_dir))

    def broker_pids(self) -> dict[str, list[int]]:
        pids = {"source": self.source.broker.pid, "destination": self.target.broker.pid}
        return {side: [] if pid is None else [pid] for side, pid in pids.items()}

    def far(self, side: str, delay: float) -> None:
        (self.source if side == "source" else self.target).link.set_delay(delay)


def links(bench: Bench, opts: Options) -> Table:
    table = Table(
        f"LINKS: a 240 ms round trip to the source or the target, {opts.partitions} partitions, "
        f"{opts.steady_records:,} records of {opts.size} B, on Tansu brokers (any --brokers)",
        ["far side", *STEADY_HEADERS],
    )
    steady_notes(table)
    table.notes.append(
        f"far side: that cluster sits behind a proxy delaying every chunk {ONE_WAY * 1000:.0f} ms "
        "each way; the other is on loopback. Data is produced and copies are checked with the "
        f"delay off. The confluent loop flushes and commits every {LOOP_FLUSH_INTERVAL:g} s."
    )
    for side in ("source", "target"):
        with LinkedCluster(bench.workdir) as cluster:
            linked = Bench(cluster, bench.workdir, bench.ktm_settings, LOOP_FLUSH_INTERVAL)
            print(f"\n[links] the {side} 240 ms away, {opts.steady_records:,} records")
            with dataset(cluster, opts.partitions, opts.steady_records, opts.size) as data:
                for kind in [k for k in runnable(opts.contenders) if k != "naive"]:
                    cluster.far(side, ONE_WAY)
                    try:
                        near = functools.partial(cluster.far, side, 0)
                        run = steady_once(linked, kind, data, near)
                    finally:
                        cluster.far(side, 0)
                    row = Table("", list(STEADY_HEADERS))
                    steady_row(row, data, run, None)
                    table.add(side, *row.rows[0])
    return table
