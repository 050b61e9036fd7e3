"""What a running relay costs and how late it is across rates: the latency measurement
(measure_live.latency_once) at each of `--rates`, every contender in turn, so a default that
trades latency for CPU (fetch waits, report intervals, linger) is chosen from one table."""

from __future__ import annotations

import dataclasses
import os

from scripts.bench import report
from scripts.bench.brokers import SIDES
from scripts.bench.contenders import LABELS, Bench, runnable
from scripts.bench.machine import load_average
from scripts.bench.measure_live import (
    FAST_FEED_ABOVE,
    RATE_SETTLE_S,
    LatencyRun,
    latency_once,
    spread,
)
from scripts.bench.options import Options
from scripts.bench.report import Table

HEADERS = [
    "rate /s",
    "contender",
    "sent at /s",
    "p50 ms",
    "p99 ms",
    "p99.9 ms",
    "max ms",
    "probe backlog",
    "CPU cores busy",
    "CPU µs/record",
    "src broker cores",
    "dst broker cores",
    "check",
]


def row(table: Table, rate: float, run: LatencyRun, total: int) -> None:
    table.add(
        f"{rate:,.0f}",
        LABELS[run.kind],
        report.count(run.lat.sent_rate if run.lat else None),
        *spread(run.lat),
        report.seconds(run.cpu_share, 3),
        report.per_record_us(run.cpu_seconds, total),
        *(report.seconds((run.broker_cores or {}).get(side), 3) for side in SIDES),
        run.check,
    )


def rates(bench: Bench, opts: Options) -> Table:
    table = Table(
        f"RATES: a running relay fed each rate for {opts.seconds:.0f} s, {opts.partitions} "
        f"partitions, {opts.size} B; latency = destination reader's clock - source CreateTime",
        list(HEADERS),
    )
    table.notes += [
        "Each row is the latency section's run at that rate: timing and CPU counting start once "
        "a warm-up record came through on every partition and the rate was fed untimed for "
        f"{RATE_SETTLE_S:.0f} s; latencies include up to 20 ms of the "
        "reader's fetch wait. sent at /s below the rate: the feeder (in the bench's process; "
        f"kafka-python, confluent-kafka above {FAST_FEED_ABOVE:,.0f}/s) could not keep up, and "
        "the relay saw that rate instead; probe backlog > 0: the reader, not the relay, was "
        "late.",
        f"CPU cores busy = CPU seconds of the relay's process tree per second (of "
        f"{os.cpu_count()}); src/dst broker cores: each broker's own, apart. The latency-tuned "
        "loop takes a batch at least every 50 ms, flushes it, then commits asynchronously.",
    ]
    for rate in opts.rates:
        at_rate = dataclasses.replace(opts, rate=rate)
        total = int(rate * opts.seconds)
        for kind in runnable(opts.contenders):
            print(f"\n[rates] {rate:,.0f}/s, {LABELS[kind]} (load {load_average()})", flush=True)
            row(table, rate, latency_once(bench, kind, at_rate), total)
    return table
