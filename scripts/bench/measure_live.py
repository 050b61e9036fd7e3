"""Measurements on a relay that keeps running (ktm without --stop-at-end, the loops with
--follow): latency at a fixed rate, how far /metrics trails the destination, and the time from
launch to the first record. Each relay is stopped with SIGTERM at the end."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from kafka import KafkaConsumer

from scripts.bench import report
from scripts.bench.brokers import SIDES, BrokerCpu, used_since
from scripts.bench.contenders import LABELS, Bench, Ktm, launch, runnable
from scripts.bench.data import Dataset, dataset, topic_on, topic_pair
from scripts.bench.feed import (
    DestinationCount,
    Feeder,
    Latencies,
    measure_latency,
    probe_reader,
    settle,
    warm_up,
)
from scripts.bench.machine import load_average
from scripts.bench.options import Options
from scripts.bench.processes import Finished, Launched
from scripts.bench.report import Table
from scripts.bench.sampling import Sample, Sampler, trailing_lags

WARM_UP_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 120.0
LAG_SAMPLE_EVERY_S = 0.25
SETTLE_S = 15.0  # after the feed: how long the metric may take to catch up before "never"
FAST_FEED_ABOVE = 20_000.0  # records/s: above, the feeder produces with confluent-kafka
RATE_SETTLE_S = 10.0  # latency: the rate fed untimed this long before the timed records


def stop(proc: Launched) -> Finished:
    """The clean stop every relay here supports: SIGTERM, then wait."""
    proc.signal(signal.SIGTERM)
    finished = proc.wait(STOP_TIMEOUT_S)
    if finished.returncode != 0:
        print(
            f"  {proc.name} exited {finished.returncode}; its stderr ends:\n    {finished.tail()}"
        )
    return finished


def exit_note(finished: Finished) -> str:
    return "ok" if finished.returncode == 0 else f"exit {finished.returncode}"


# ---- latency ------------------------------------------------------------------------------------


@dataclass
class LatencyRun:
    kind: str
    lat: Latencies | None = None
    warm_up: float | None = None
    cpu_share: float | None = None  # CPU seconds of the tree per second while measuring
    cpu_seconds: float | None = None  # CPU seconds of the tree while measuring
    broker_cores: dict[str, float] | None = None  # each side's broker, CPU s per s, the same
    finished: Finished | None = None
    check: str = "ok"


@dataclass
class Live:
    """A contender running on a fresh topic pair, with a feeder on its source topic and a
    reader of its destination topic."""

    feeder: Feeder
    probe: KafkaConsumer
    proc: Launched


@contextmanager
def live(bench: Bench, kind: str, opts: Options, name: str) -> Iterator[Live]:
    with topic_pair(bench.cluster, name, opts.partitions) as topics, ExitStack() as s:
        fast = opts.rate > FAST_FEED_ABOVE
        feeder = Feeder(bench.cluster.src, topics[0], opts.partitions, opts.size, fast=fast)
        s.callback(feeder.close)
        probe = probe_reader(bench.cluster.dst, topics[1], opts.partitions)
        s.callback(probe.close)
        proc = s.enter_context(launch(kind, bench, topics, opts.partitions, continuous=True))
        yield Live(feeder, probe, proc)


class CpuWindow:
    """The CPU a contender's process tree and each broker use from now until `end`."""

    def __init__(self, proc: Launched, bench: Bench):
        self.proc, self.brokers = proc, BrokerCpu(bench.cluster)
        self.cpu, self.broker_cpu = proc.monitor.cpu_seconds, self.brokers.seconds()
        self.began = time.monotonic()

    def end(self) -> tuple[float, float, dict[str, float]]:
        """(seconds, the tree's CPU seconds, each broker's cores) since the start."""
        took = time.monotonic() - self.began
        used = used_since(self.broker_cpu, self.brokers.seconds())
        cpu = self.proc.monitor.cpu_seconds - self.cpu
        return took, cpu, {side: seconds / took for side, seconds in used.items()}


def latency_once(bench: Bench, kind: str, opts: Options) -> LatencyRun:
    run = LatencyRun(kind)
    with live(bench, kind, opts, f"bench-lat-{kind}") as it:
        try:
            warm_up(it.feeder, it.probe, it.proc.alive, WARM_UP_TIMEOUT_S)
            run.warm_up = time.monotonic() - it.proc.started
            settle(it.feeder, it.probe, opts.rate, RATE_SETTLE_S)
            window = CpuWindow(it.proc, bench)
            run.lat = measure_latency(it.feeder, it.probe, opts.rate, opts.seconds)
            took, run.cpu_seconds, run.broker_cores = window.end()
            run.cpu_share = run.cpu_seconds / took
        except RuntimeError as exc:
            run.check = f"FAILED: {exc}"
        run.finished = stop(it.proc)
    return _judge_latency(run, int(opts.rate * opts.seconds))


def _judge_latency(run: LatencyRun, total: int) -> LatencyRun:
    lat, fin = run.lat, run.finished
    if lat is not None and run.check == "ok":
        missing, duplicates = total - lat.unique, len(lat.seconds) - lat.unique
        if missing or duplicates:
            run.check = f"WRONG: {missing} missing, {duplicates} duplicates"
    if fin is not None and fin.returncode != 0 and run.check == "ok":
        run.check = f"exit {fin.returncode}"
    return run


LATENCY_HEADERS = [
    "contender",
    "timed records",
    "received",
    "sent at /s",
    "p50 ms",
    "p99 ms",
    "p99.9 ms",
    "max ms",
    "probe backlog",
    "warm-up s",
    "CPU cores busy",
    "CPU µs/record",
    "src broker cores",
    "dst broker cores",
    "peak RSS MB",
    "check",
]


def spread(lat: Latencies | None) -> list[str]:
    """p50, p99, p99.9 and max in ms, then the probe's backlog."""
    ordered = lat.seconds if lat else []
    return [
        report.millis(report.percentile(ordered, 0.5)),
        report.millis(report.percentile(ordered, 0.99)),
        report.millis(report.percentile(ordered, 0.999)),
        report.millis(ordered[-1] if ordered else None),
        report.count(lat.backlog if lat else None),
    ]


def latency_row(table: Table, run: LatencyRun, total: int) -> None:
    lat, fin = run.lat, run.finished
    table.add(
        LABELS[run.kind],
        f"{total:,}",
        report.count(lat.unique if lat else None),
        report.count(lat.sent_rate if lat else None),
        *spread(lat),
        report.seconds(run.warm_up),
        report.seconds(run.cpu_share, 2),
        report.per_record_us(run.cpu_seconds, total),
        *(report.seconds((run.broker_cores or {}).get(side), 2) for side in SIDES),
        report.megabytes(fin.peak_rss if fin else None),
        run.check,
    )


def latency(bench: Bench, opts: Options) -> Table:
    table = Table(
        f"LATENCY at {opts.rate:,.0f} records/s for {opts.seconds:.0f} s, {opts.partitions} "
        f"partitions, {opts.size} B: destination reader's clock - source CreateTime",
        list(LATENCY_HEADERS),
    )
    table.notes += [
        "The relay runs continuously; timing starts once a warm-up record came through on every "
        f"partition (warm-up s, from launch) and the rate was fed untimed for "
        f"{RATE_SETTLE_S:.0f} s. Latencies include up to 20 ms of the reader's fetch "
        "wait. probe backlog > 0: the reader, not the relay, was late. sent at /s below the "
        "target: the feeder could not keep up.",
        f"CPU cores busy = CPU seconds of the relay's tree per second while timing (of "
        f"{os.cpu_count()}); CPU µs/record = those CPU seconds / timed records. src/dst broker "
        "cores: the source's / the destination's broker processes (psutil on their pids) per "
        "second over the same time, apart from the relay's (feeder and probe reader included).",
    ]
    for kind in runnable(opts.contenders):
        print(f"\n[latency] {LABELS[kind]} (load average {load_average()}) ...", flush=True)
        latency_row(table, latency_once(bench, kind, opts), int(opts.rate * opts.seconds))
    return table


# ---- metrics lag --------------------------------------------------------------------------------


def sample_destination(counter: DestinationCount, feeder: Feeder, metric: Sampler) -> list[Sample]:
    """(time, records in the destination) every LAG_SAMPLE_EVERY_S, until the feed is over and
    the metric caught up with a destination that stopped growing (or SETTLE_S passed)."""
    samples: list[Sample] = []
    deadline: float | None = None
    tick = time.monotonic()
    while deadline is None or time.monotonic() < deadline:
        count = counter.poll(timeout_ms=20)  # polls between ticks keep the count fresh
        now = time.monotonic()
        if now < tick or count is None:
            continue
        samples.append((now, count))
        tick = now + LAG_SAMPLE_EVERY_S
        if feeder.finished():
            deadline = deadline or now + SETTLE_S
            if _settled(samples, metric.last()):
                break
    return samples


def _settled(samples: list[Sample], metric: int | None) -> bool:
    """The destination did not grow for a second and the metric has reached it."""
    recent = samples[-int(1 / LAG_SAMPLE_EVERY_S) - 1 :]
    return metric is not None and metric >= samples[-1][1] and recent[0][1] == recent[-1][1]


LAG_HEADERS = [
    "fed records",
    "destination samples",
    "max lag s",
    "p95 lag s",
    "p50 lag s",
    "samples never reached",
    "final destination",
    "final metric",
    "ktm exit",
]


def metrics_lag(bench: Bench, opts: Options) -> Table:
    print(f"\n[metrics_lag] ktm fed {opts.rate:,.0f}/s for {opts.seconds:.0f} s ...", flush=True)
    with topic_pair(bench.cluster, "bench-lag", opts.partitions) as topics, ExitStack() as s:
        feeder = Feeder(bench.cluster.src, topics[0], opts.partitions, opts.size)
        s.callback(feeder.close)
        counter = DestinationCount(bench.cluster.dst, topics[1], opts.partitions)
        s.callback(counter.close)
        ktm = s.enter_context(Ktm(bench, *topics, stop_at_end=False))
        try:
            warm_up(feeder, counter.consumer, ktm.alive, WARM_UP_TIMEOUT_S)
        except RuntimeError:
            stop(ktm)  # shows why it exited
            raise
        with Sampler(ktm.produced, LAG_SAMPLE_EVERY_S) as metric:
            feeder.start(opts.rate, opts.seconds)
            truth = sample_destination(counter, feeder, metric)
        finished = stop(ktm)
    return _lag_table(opts, truth, metric, finished)


def _lag_table(opts: Options, truth: list[Sample], metric: Sampler, finished: Finished) -> Table:
    lags, never = trailing_lags(truth, metric.samples)
    table = Table(
        f"METRICS LAG: ktm_messages_produced_total vs the destination, fed {opts.rate:,.0f} "
        f"records/s for {opts.seconds:.0f} s, {opts.partitions} partitions",
        list(LAG_HEADERS),
    )
    final_truth = truth[-1][1] if truth else None
    table.add(
        f"{int(opts.rate * opts.seconds):,}",
        len(truth),
        report.seconds(lags[-1] if lags else None, 2),
        report.seconds(report.percentile(lags, 0.95), 2),
        report.seconds(report.percentile(lags, 0.5), 2),
        never,
        report.count(final_truth),
        report.count(metric.last()),
        exit_note(finished),
    )
    table.notes.append(
        f"Every {LAG_SAMPLE_EVERY_S} s: the destination's record count (summed high watermarks of "
        "a reader's fetches, at most ~20 ms old) and the summed metric from /metrics. For each "
        "destination sample (t, n): lag = t' - t for the first scrape t' with metric >= n "
        f"(resolution {LAG_SAMPLE_EVERY_S} s; negative: the metric was first). Final counts "
        "include the warm-up records (one per partition until each came through)."
    )
    return table


# ---- time to first record -----------------------------------------------------------------------

FIRST_HEADERS = [
    "contender",
    "backlog",
    "launch -> first record s",
    "launch -> all records s",
    "spark start s (summary)",
    "first record s (summary)",
    "stop",
    "peak RSS MB",
]


def first_record_once(bench: Bench, kind: str, data: Dataset) -> list[object]:
    with (
        topic_on(bench.cluster.dst, f"bench-first-{kind}", data.partitions) as target,
        ExitStack() as s,
    ):
        counter = DestinationCount(bench.cluster.dst, target, data.partitions)
        s.callback(counter.close)
        counter.ready()  # the reader's own start-up is not part of what is timed
        proc = s.enter_context(
            launch(kind, bench, (data.topic, target), data.partitions, continuous=True)
        )
        all_at = counter.wait_for(data.records, proc.alive, WARM_UP_TIMEOUT_S)
        first_at = counter.first_seen
        finished = stop(proc)
    summary = (proc.summary() if isinstance(proc, Ktm) else None) or {}
    first = None if first_at is None else first_at - proc.started
    return [
        LABELS[kind],
        f"{data.records:,}",
        report.seconds(first),
        report.seconds(None if all_at is None else all_at - proc.started),
        report.seconds(summary.get("spark_start")),
        report.seconds(summary.get("first_record")),
        exit_note(finished),
        report.megabytes(finished.peak_rss),
    ]


def first_record(bench: Bench, opts: Options) -> Table:
    table = Table(
        f"TIME TO FIRST RECORD: relay launched with {opts.first_records:,} records waiting, "
        f"{opts.partitions} partitions",
        list(FIRST_HEADERS),
    )
    table.notes += [
        "launch -> first/all: from starting the process to a destination reader (20 ms fetch "
        "wait) receiving the first / the last waiting record. spark start, first record: ktm's "
        "--summary-json (its clock starts after imports and config loading; first record is "
        "when the driver heard of the first acknowledgement).",
    ]
    print(f"\n[first_record] {opts.first_records:,} records waiting", flush=True)
    with dataset(bench.cluster, opts.partitions, opts.first_records, opts.size) as data:
        for kind in runnable(opts.contenders):
            print(f"  {LABELS[kind]} (load average {load_average()}) ...", flush=True)
            table.add(*first_record_once(bench, kind, data))
    return table
