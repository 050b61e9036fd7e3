"""Benchmark ktm against the relay loop every team writes, on local Tansu brokers it starts.

    /work/venv/bin/python scripts/bench.py [--records 500000] [--size 100] [--partitions 4]
        [--only ktm,naive,confluent] [--latency-rate 5000 --latency-seconds 20]
        [--scaling 1,2,4,8 --scaling-records 200000] [--epoch-duration 5s]
        [--skip-throughput] [--skip-latency] [--skip-scaling]

Throughput: N records (keys, two headers, explicit partitions and timestamps) are produced into
a source topic (not timed). Then, on that same data, each contender copies them into a fresh
destination topic and the copy is checked record by record (count, key, value, timestamp,
headers, order per partition):
  ktm        `ktm relay --mode single --stop-at-end`, whole process (JVM and Spark start
             included), plus its steady state: records of epochs 2..n / their summed time,
             parsed from ktm's log;
  naive      scripts/bench_loops.py naive: one kafka-python process: poll, send, flush, commit;
  confluent  scripts/bench_loops.py confluent: the same loop with confluent-kafka (librdkafka).
Peak RSS/PSS and CPU seconds are summed over each contender's process tree (psutil, every 0.2 s).

Latency: with the relay already running (ktm continuous, the naive loop following), records are
produced at a fixed rate; a consumer on the destination takes (its wall clock - the record's
source CreateTime, which the relays preserve): an upper bound of source timestamp -> destination
ack. Scaling: ktm's rate with 1, 2, 4, 8 source partitions.

Optional packages (not ktm dependencies): pip install psutil confluent-kafka
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402

from tests.kafka_env import TansuBroker, create_topic  # noqa: E402

try:
    import psutil
except ImportError:  # the memory and CPU columns say how to get it
    psutil = None

KTM = Path(sys.executable).parent / "ktm"
LOOPS = REPO / "scripts" / "bench_loops.py"
CONTENDERS = ("ktm", "naive", "confluent")
LABELS = {
    "ktm": "ktm relay (whole process)",
    "naive": "naive kafka-python loop",
    "confluent": "confluent-kafka loop",
}
PROVENANCE_HEADER = "ktm.src"  # relay.plan.PROVENANCE_HEADER: ktm's own header, not compared
SAMPLE_EVERY_S = 0.2
RUN_TIMEOUT_S = 1800.0
STOP_TIMEOUT_S = 90.0
IDLE_EXIT_S = 5.0
MB = 1_000_000
EPOCH_RE = re.compile(r"epoch (\d+): (\d+) records in ([\d.]+)s")
DONE_RE = re.compile(
    r"(?:done|stopped by signal): (\d+) records relayed.*? in ([\d.]+)s "
    r"\(spark start ([\d.]+)s, (\d+) epochs, epoch overhead ([\d.]+)s\)"
)
PSUTIL_HINT = f"psutil is not installed: {sys.executable} -m pip install psutil"
CONFLUENT_HINT = (
    f"confluent-kafka is not installed: {sys.executable} -m pip install confluent-kafka"
)


# ---- the machine and the code ------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def ram_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return float("nan")


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def code_version() -> str:
    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True).stdout

    dirty = git("status", "--porcelain", "--", "relay").splitlines()
    changed = ", ".join(line[3:] for line in dirty) or "none"
    head = git("rev-parse", "--short", "HEAD").strip() or "?"
    return f"git {head}; uncommitted in relay/: {changed}"


def print_header(args: argparse.Namespace) -> None:
    print("=" * 100)
    print(f"ktm benchmark  {time.strftime('%Y-%m-%d %H:%M:%S')}")
    print(
        f"machine: {os.cpu_count()} CPUs ({cpu_model()}), {ram_gib():.1f} GiB RAM, "
        f"Python {platform.python_version()}, load average {load_average()} at start"
    )
    print(f"code:    {code_version()}")
    print(
        f"data:    {args.size} B values (+ ~8 B key, 2 headers), {args.partitions} partitions"
        + ("" if args.skip_throughput else f", {args.records} records")
        + f"; ktm epoch_duration {args.epoch_duration}"
    )
    print(
        "brokers: Tansu (memory storage), one source and one destination broker, on this same "
        "machine (they share its CPUs with the contenders)"
    )
    for hint in missing_hints(args):
        print(f"note:    {hint}")
    print("=" * 100, flush=True)


def missing_hints(args: argparse.Namespace) -> list[str]:
    hints = [] if psutil else [PSUTIL_HINT + " (memory and CPU columns left empty)"]
    if "confluent" in args.only and not has_confluent():
        hints.append(CONFLUENT_HINT + " (its rows are skipped)")
    return hints


def has_confluent() -> bool:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return False
    return True


# ---- brokers, topics, data ----------------------------------------------------------------------


class Cluster:
    """One source and one destination Tansu broker, started here and stopped on exit."""

    def __init__(self, log_dir: Path):
        self.source = TansuBroker("bench-source", log_dir=log_dir)
        self.target = TansuBroker("bench-target", log_dir=log_dir)

    def __enter__(self) -> Cluster:
        self.source.start()
        self.target.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.source.stop()
        self.target.stop()

    @property
    def src(self) -> str:
        return self.source.bootstrap

    @property
    def dst(self) -> str:
        return self.target.bootstrap


def new_topic(bootstrap: str, prefix: str, partitions: int) -> str:
    return create_topic(bootstrap, f"{prefix}-{uuid.uuid4().hex[:8]}", partitions)


def delete_topic(bootstrap: str, topic: str) -> None:
    """Tansu keeps everything in memory: drop each topic once it has served."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([topic])
    except Exception as exc:  # noqa: BLE001 - only memory is at stake
        print(f"  (could not delete topic {topic}: {exc})")
    finally:
        admin.close()


def payload(seq: int, size: int, filler: bytes) -> bytes:
    head = b"%012d|" % seq
    return head + filler[: size - len(head)]


def produce_dataset(bootstrap: str, topic: str, count: int, size: int, partitions: int) -> float:
    """Produce ``count`` records; raise if any is not acknowledged. Returns seconds taken."""
    began = time.monotonic()
    filler = (b"abcdefghijklmnopqrstuvwxyz" * (size // 26 + 1))[:size]
    base_ms = int(time.time() * 1000) - count
    errors: list[BaseException] = []
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=50, batch_size=512 * 1024
    )
    try:
        for seq in range(count):
            producer.send(
                topic,
                key=b"user-%d" % (seq % 1000),
                value=payload(seq, size, filler),
                headers=[("trace-id", b"%016x" % seq), ("origin", b"bench")],
                partition=seq % partitions,
                timestamp_ms=base_ms + seq,
            ).add_errback(errors.append)
        producer.flush()
    finally:
        producer.close()
    if errors:
        raise RuntimeError(f"{len(errors)} source records not acknowledged: {errors[0]}")
    return time.monotonic() - began


Digest = dict[int, tuple[int, str]]  # partition -> (records, hash of records in order)


def digest_topic(bootstrap: str, topic: str, partitions: int, expected: int) -> Digest:
    """Read ``topic`` to its real end (a fetch's high watermark) and hash every record."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    hashes = {p: hashlib.blake2b(digest_size=16) for p in range(partitions)}
    counts = dict.fromkeys(range(partitions), 0)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
        max_poll_records=10000,
        max_partition_fetch_bytes=8 * MB,
    )
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + 60 + expected / 20000
        while not at_high_watermark(consumer, tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end; got {counts}")
            for tp, records in consumer.poll(timeout_ms=200).items():
                counts[tp.partition] += len(records)
                for r in records:
                    hashes[tp.partition].update(fingerprint(r))
    finally:
        consumer.close()
    return {p: (counts[p], hashes[p].hexdigest()) for p in range(partitions)}


def fingerprint(record: Any) -> bytes:
    headers = [(k, v) for k, v in record.headers or () if k != PROVENANCE_HEADER]
    return repr((record.key, record.value, record.timestamp, headers)).encode()


def at_high_watermark(consumer: KafkaConsumer, tps: list[TopicPartition]) -> bool:
    for tp in tps:
        highwater = consumer.highwater(tp)  # None until a fetch for tp has returned
        if highwater is None or consumer.position(tp) < highwater:
            return False
    return True


def compare(expected: Digest, got: Digest) -> str:
    """'ok', or what differs between the source's and the destination's records."""
    if got == expected:
        return "ok"
    counts = {p: got[p][0] for p in got}
    want = {p: expected[p][0] for p in expected}
    if counts != want:
        return f"WRONG: records per partition {counts}, expected {want}"
    bad = sorted(p for p in got if got[p] != expected[p])
    return f"WRONG: same counts but different records or order in partitions {bad}"


# ---- running a contender: its process tree, time, memory and CPU --------------------------------


class TreeMonitor:
    """Samples a process and all its descendants: peak summed RSS and PSS, CPU seconds."""

    def __init__(self, pid: int):
        self.peak_rss = self.peak_pss = 0
        self._cpu: dict[int, float] = {}  # pid -> last seen user+system seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if psutil is None:
            return
        try:
            self._root = psutil.Process(pid)
        except psutil.Error:
            return
        self._thread = threading.Thread(target=self._run, name="tree-monitor", daemon=True)
        self._thread.start()

    @property
    def cpu_seconds(self) -> float | None:
        return sum(self._cpu.values()) if psutil else None

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(SAMPLE_EVERY_S):
                return

    def _sample(self) -> None:
        try:
            procs = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            return
        rss = pss = 0
        for proc in procs:
            try:
                with proc.oneshot():
                    mem, cpu = proc.memory_full_info(), proc.cpu_times()
            except psutil.Error:
                continue
            rss += mem.rss
            pss += getattr(mem, "pss", mem.rss)
            self._cpu[proc.pid] = cpu.user + cpu.system
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


@dataclass
class Finished:
    name: str
    returncode: int
    wall: float
    stdout: str
    stderr: str
    monitor: TreeMonitor
    check: str = "not checked"


class Launched:
    """A contender's process in its own session (so its whole tree can be reaped), output to
    files, sampled by a TreeMonitor from the start."""

    def __init__(self, name: str, cmd: list[str], workdir: Path):
        self.name = name
        self._out = (workdir / f"{name}.stdout").open("w+")
        self._err = (workdir / f"{name}.stderr").open("w+")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=self._err,
            start_new_session=True,
        )
        self.monitor = TreeMonitor(self.proc.pid)

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # ktm's clean stop; the loops' stop flag

    def stderr_text(self) -> str:
        self._err.flush()
        return Path(self._err.name).read_text(errors="replace")

    def wait(self, timeout: float) -> Finished:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            print(f"  {self.name}: still running after {timeout:.0f} s, killed")
            self._reap()
            code = self.proc.wait()
        wall = time.monotonic() - self.started
        self.monitor.stop()
        self._reap()  # e.g. a JVM or Python worker left behind
        out, err = (Path(f.name).read_text(errors="replace") for f in (self._out, self._err))
        self._out.close()
        self._err.close()
        return Finished(self.name, code, wall, out, err, self.monitor)

    def _reap(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the session this script created
        except (ProcessLookupError, PermissionError):
            pass


def ktm_command(
    cluster: Cluster, workdir: Path, source: str, target: str, epoch: str, stop_at_end: bool
) -> list[str]:
    config = workdir / f"ktm-{uuid.uuid4().hex[:8]}.toml"
    config.write_text(
        "[app]\n"
        'metrics_addr = ""\n'
        f'group_id = "bench-{uuid.uuid4().hex[:8]}"\n\n'
        f'[spark]\nepoch_duration = "{epoch}"\n\n'
        f'[topics]\n"{source}" = "{target}"\n\n'
        f'[[sources]]\nname = "bench-source"\nservers = ["{cluster.src}"]\n\n'
        f'[target]\nservers = ["{cluster.dst}"]\n'
    )
    cmd = [str(KTM), "relay", "--config", str(config), "--mode", "single"]
    return cmd + (["--stop-at-end"] if stop_at_end else [])


def loop_command(
    kind: str, cluster: Cluster, source: str, target: str, partitions: int, follow: bool
) -> list[str]:
    cmd = [sys.executable, str(LOOPS), kind, "--src", cluster.src, "--dst", cluster.dst]
    cmd += ["--source", source, "--target", target, "--partitions", str(partitions)]
    cmd += ["--group", f"bench-{kind}-{uuid.uuid4().hex[:8]}"]
    return cmd + (["--idle-exit", str(IDLE_EXIT_S)] if follow else [])


def contender_command(
    kind: str, cluster: Cluster, workdir: Path, topics: tuple[str, str], args: argparse.Namespace
) -> list[str]:
    source, target = topics
    if kind == "ktm":
        return ktm_command(cluster, workdir, source, target, args.epoch_duration, True)
    return loop_command(kind, cluster, source, target, args.partitions, follow=False)


# ---- ktm's log ----------------------------------------------------------------------------------


@dataclass
class KtmLog:
    epochs: list[tuple[int, float]] = field(default_factory=list)  # (records, seconds)
    relayed: int | None = None
    relay_seconds: float | None = None  # ktm's run(): Spark start + epochs
    spark_start: float | None = None
    overhead: float | None = None  # Spark's time between and around the tasks of each epoch

    @classmethod
    def parse(cls, stderr: str) -> KtmLog:
        parsed = cls()
        for line in stderr.splitlines():
            if match := EPOCH_RE.search(line):
                parsed.epochs.append((int(match[2]), float(match[3])))
            elif match := DONE_RE.search(line):
                parsed.relayed, parsed.relay_seconds = int(match[1]), float(match[2])
                parsed.spark_start, parsed.overhead = float(match[3]), float(match[5])
        return parsed

    def steady(self) -> tuple[int, float] | None:
        """(records, seconds) of epochs 2..n: the first one pays for worker start-up."""
        later = self.epochs[1:]
        seconds = sum(s for _, s in later)
        return (sum(r for r, _ in later), seconds) if later and seconds > 0 else None

    @property
    def steady_is_thin(self) -> bool:
        """Only epoch 2 counts and, with --stop-at-end, it is the final, partial epoch."""
        return len(self.epochs) < 3


THIN_STEADY = (
    "* steady state from the final, partial epoch alone (one sample; with few records it is "
    "mostly Spark job overhead): use more records or a shorter --epoch-duration"
)


def ktm_breakdown(wall: float, parsed: KtmLog) -> str:
    if parsed.relay_seconds is None or parsed.spark_start is None or parsed.overhead is None:
        return "ktm: no 'done:' summary line found in its log: no time breakdown"
    epochs_s = parsed.relay_seconds - parsed.spark_start
    share = 100 * parsed.overhead / epochs_s if epochs_s > 0 else 0.0
    outside = wall - parsed.relay_seconds
    return (
        f"ktm time: process {wall:.1f} s = Spark start {parsed.spark_start:.1f} s"
        f" + epochs {epochs_s:.1f} s (epochs: {len(parsed.epochs)}; Spark epoch overhead "
        f"{parsed.overhead:.1f} s = {share:.0f}% of epoch time)"
        f" + {outside:.1f} s outside run() (interpreter and imports, cluster checks, resume "
        "points, Spark stop)"
    )


# ---- results and tables -------------------------------------------------------------------------


def mb(size: int | None) -> str:
    return f"{size / 2**20:.0f}" if size else "-"


def rate(records: float, seconds: float) -> float:
    return records / seconds if seconds > 0 else float("nan")


def print_table(title: str, headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]

    def line(cells: list[str]) -> str:
        return "  ".join(str(cell).ljust(width) for cell, width in zip(cells, widths, strict=True))

    print(f"\n{title}")
    print(line(headers))
    print(line(["-" * w for w in widths]))
    for row in rows:
        print(line(row))


@dataclass
class Row:
    label: str
    seconds: float | None = None
    records: int = 0
    finished: Finished | None = None
    check: str = "ok"

    @property
    def rate(self) -> float | None:
        return rate(self.records, self.seconds) if self.seconds else None

    def cells(self, size: int, ktm: tuple[float | None, float | None]) -> list[str]:
        if self.rate is None:
            return [self.label, "-", "-", "-", "-", "-", "-", "-", "-", self.check]
        mon = self.finished.monitor if self.finished else None
        cpu = mon.cpu_seconds if mon else None
        ratios = [f"{k / self.rate:.2f}x" if k else "-" for k in ktm]
        return [
            self.label,
            f"{self.seconds:.1f}",
            f"{self.rate:,.0f}",
            f"{self.rate * size / MB:.1f}",
            mb(mon.peak_rss) if mon else "-",
            mb(mon.peak_pss) if mon else "-",
            f"{cpu:.1f}" if cpu is not None else "-",
            *ratios,
            self.check,
        ]


THROUGHPUT_HEADERS = [
    "contender", "seconds", "records/s", "MB/s", "peak RSS MB", "peak PSS MB", "CPU s",
    "ktm whole / this", "ktm steady / this", "copy check",
]  # fmt: skip


# ---- section 1: throughput ----------------------------------------------------------------------


@dataclass
class Workload:
    source: str
    expected: Digest
    partitions: int
    records: int


def run_throughput(
    kind: str, cluster: Cluster, workdir: Path, work: Workload, args: argparse.Namespace
) -> Finished | str:
    """Copy the source topic into a fresh destination topic; the run, or why it failed."""
    target = new_topic(cluster.dst, f"bench-{kind}", work.partitions)
    try:
        if kind == "ktm":
            topics = (work.source, target)
            cmd = ktm_command(cluster, workdir, *topics, args.epoch_duration, stop_at_end=True)
        else:
            cmd = loop_command(kind, cluster, work.source, target, work.partitions, follow=False)
        finished = Launched(f"{kind}-p{work.partitions}", cmd, workdir).wait(RUN_TIMEOUT_S)
        if finished.returncode != 0:
            tail = "\n    ".join(finished.stderr.strip().splitlines()[-15:])
            print(f"  {kind} exited {finished.returncode}; last lines of stderr:\n    {tail}")
            return f"FAILED: exit {finished.returncode}"
        got = digest_topic(cluster.dst, target, work.partitions, work.records)
        finished.check = compare(work.expected, got)
        return finished
    finally:
        delete_topic(cluster.dst, target)


def prepare_source(
    cluster: Cluster, partitions: int, records: int, args: argparse.Namespace
) -> Workload:
    source = new_topic(cluster.src, "bench-source", partitions)
    print(f"  producing {records} records into {source} (not timed) ...", flush=True)
    took = produce_dataset(cluster.src, source, records, args.size, partitions)
    expected = digest_topic(cluster.src, source, partitions, records)
    held = sum(count for count, _ in expected.values())
    print(f"  produced in {took:.1f} s; the source topic holds {held} records")
    if held != records:
        raise RuntimeError(f"source topic holds {held} records, not {records}")
    return Workload(source, expected, partitions, records)


def throughput_rows(kind: str, outcome: Finished | str, records: int) -> list[Row]:
    if isinstance(outcome, str):
        return [Row(LABELS[kind], check=outcome)]
    rows = [Row(LABELS[kind], outcome.wall, records, outcome, outcome.check)]
    if kind == "ktm":
        parsed = KtmLog.parse(outcome.stderr)
        steady = parsed.steady()
        label = "ktm steady state (epochs 2..n)"
        if steady is None:
            rows.append(Row(label, check=f"n/a: {len(parsed.epochs)} epoch(s) in the log"))
        else:
            thin = " *" if parsed.steady_is_thin else ""
            rows.append(Row(label + thin, steady[1], steady[0], None, outcome.check))
        print("  " + ktm_breakdown(outcome.wall, parsed))
        if steady is not None and parsed.steady_is_thin:
            print("  " + THIN_STEADY)
    else:
        loop = json.loads(outcome.stdout.strip().splitlines()[-1])
        print(
            f"  {kind}: {loop['records']} records in {loop['loop_seconds']:.1f} s inside the loop"
            f" ({rate(loop['records'], loop['loop_seconds']):,.0f}/s); the rest of "
            f"{outcome.wall:.1f} s is interpreter start and imports"
        )
    return rows


def section_throughput(cluster: Cluster, workdir: Path, args: argparse.Namespace) -> bool:
    print(f"\n[throughput] {args.records} records, {args.partitions} partitions")
    work = prepare_source(cluster, args.partitions, args.records, args)
    rows: list[Row] = []
    for kind in args.only:
        if kind == "confluent" and not has_confluent():
            print(f"  {CONFLUENT_HINT}: skipping its row")
            rows.append(Row(LABELS[kind], check="skipped: pip install confluent-kafka"))
            continue
        print(f"  running {kind} (load average {load_average()}) ...", flush=True)
        outcome = run_throughput(kind, cluster, workdir, work, args)
        rows += throughput_rows(kind, outcome, args.records)
    delete_topic(cluster.src, work.source)
    print_throughput(rows, args)
    return all(row.check == "ok" or row.check.startswith(("skipped", "n/a")) for row in rows)


def print_throughput(rows: list[Row], args: argparse.Namespace) -> None:
    ktm = [r.rate for r in rows if r.label.startswith("ktm") and r.check == "ok"]
    ktm += [None] * (2 - len(ktm))
    title = (
        f"THROUGHPUT: {args.records} records x {args.size} B, {args.partitions} partitions "
        f"(MB/s counts values only; RSS and PSS summed over the process tree; CPU s = user+sys "
        f"of the tree)"
    )
    cells = [
        r.cells(args.size, (None, None) if r.label.startswith("ktm") else (ktm[0], ktm[1]))
        for r in rows
    ]
    print_table(title, THROUGHPUT_HEADERS, cells)
    print(
        "ktm steady state = records of epochs 2..n / their summed wall time (from ktm's "
        "'epoch N: K records in S s' log lines): Spark start, first-epoch worker start-up and "
        "shutdown excluded. Ratios > 1 mean ktm is faster."
    )
    if any(r.label.endswith("*") for r in rows):
        print(THIN_STEADY)


# ---- section 2: latency at a fixed rate ---------------------------------------------------------

TIMED = ("bench", b"timed")
WARM_UP = ("bench", b"warm-up")


@dataclass
class Latencies:
    millis: list[float]  # sorted
    sent: int
    unique: int
    send_seconds: float
    probe_backlog: int  # most destination records the measuring consumer had yet to read

    def pct(self, q: float) -> str:
        if not self.millis:
            return "-"
        return f"{self.millis[min(len(self.millis) - 1, int(q * len(self.millis)))]:.0f}"


class LatencyProbe:
    """Writes into the relay's source topic, reads its destination topic, times each trip."""

    def __init__(self, cluster: Cluster, topics: tuple[str, str], partitions: int, size: int):
        self.source, self.partitions, self.size = topics[0], partitions, size
        self.filler = (b"abcdefghijklmnopqrstuvwxyz" * (size // 26 + 1))[:size]
        self.producer = KafkaProducer(bootstrap_servers=cluster.src, acks="all", linger_ms=0)
        self.consumer = KafkaConsumer(
            bootstrap_servers=cluster.dst,
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=20,  # adds at most this much to each measured latency
        )
        tps = [TopicPartition(topics[1], p) for p in range(partitions)]
        self.consumer.assign(tps)
        self.consumer.seek_to_beginning(*tps)
        self.send_seconds = 0.0

    def close(self) -> None:
        self.producer.close()
        self.consumer.close()

    def _send(self, partition: int, header: tuple[str, bytes], seq: int) -> None:
        self.producer.send(
            self.source,
            key=b"user-%d" % (seq % 1000),
            value=payload(seq, self.size, self.filler),
            headers=[header],
            partition=partition,
            timestamp_ms=int(time.time() * 1000),  # the CreateTime the relay must preserve
        )

    def warm_up(self, launched: Launched, timeout: float) -> float:
        """Until a record sent to each partition came through the relay; seconds waited."""
        began = time.monotonic()
        seen: set[int] = set()
        while len(seen) < self.partitions:
            if launched.proc.poll() is not None or time.monotonic() - began > timeout:
                raise RuntimeError(f"relay not passing records through after {timeout:.0f} s")
            for partition in set(range(self.partitions)) - seen:
                self._send(partition, WARM_UP, 0)
            seen.update(tp.partition for tp in self.consumer.poll(timeout_ms=500))
        return time.monotonic() - began

    def _paced(self, rate: float, total: int) -> None:
        began = time.monotonic()
        for seq in range(total):
            delay = began + seq / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self._send(seq % self.partitions, TIMED, seq)
        self.producer.flush()
        self.send_seconds = time.monotonic() - began

    def measure(self, rate: float, seconds: float) -> Latencies:
        total = int(rate * seconds)
        sender = threading.Thread(target=self._paced, args=(rate, total), daemon=True)
        sender.start()
        millis: list[float] = []
        seqs: set[bytes] = set()
        backlog = 0
        deadline = time.monotonic() + seconds + 60
        while len(millis) < total and time.monotonic() < deadline:
            for records in self.consumer.poll(timeout_ms=100).values():
                now_ms = time.time() * 1000
                for r in records:
                    if r.headers and r.headers[0] == TIMED:
                        millis.append(now_ms - r.timestamp)
                        seqs.add(r.value[:12])
            backlog = max(backlog, self._backlog())
        sender.join()
        return Latencies(sorted(millis), total, len(seqs), self.send_seconds, backlog)

    def _backlog(self) -> int:
        """Records already in the destination that this consumer has not read: if this grows,
        the probe, not the relay, is what is slow."""
        behind = 0
        for tp in self.consumer.assignment():
            highwater = self.consumer.highwater(tp)
            if highwater is not None:
                behind += max(0, highwater - self.consumer.position(tp))
        return behind


@dataclass
class LatencyRun:
    kind: str
    lat: Latencies | None = None
    warm_up: float = 0.0
    cpu_share: float | None = None  # CPU seconds of the tree per second, while measuring
    finished: Finished | None = None
    check: str = "ok"


def run_latency(kind: str, cluster: Cluster, workdir: Path, args: argparse.Namespace) -> LatencyRun:
    topics = (
        new_topic(cluster.src, f"bench-lat-{kind}", args.partitions),
        new_topic(cluster.dst, f"bench-lat-{kind}", args.partitions),
    )
    if kind == "ktm":  # continuous mode, stopped with SIGTERM
        cmd = ktm_command(cluster, workdir, *topics, args.epoch_duration, stop_at_end=False)
    else:  # follows the topic, exits IDLE_EXIT_S after the last record
        cmd = loop_command(kind, cluster, *topics, args.partitions, follow=True)
    launched = Launched(f"latency-{kind}", cmd, workdir)
    probe = LatencyProbe(cluster, topics, args.partitions, args.size)
    run = LatencyRun(kind)
    try:
        run.warm_up = probe.warm_up(launched, timeout=300)
        if kind == "ktm":
            wait_first_epoch(launched, timeout=300)
            run.warm_up = time.monotonic() - launched.started
        cpu_before, began = launched.monitor.cpu_seconds, time.monotonic()
        run.lat = probe.measure(args.latency_rate, args.latency_seconds)
        if cpu_before is not None and launched.monitor.cpu_seconds is not None:
            run.cpu_share = (launched.monitor.cpu_seconds - cpu_before) / (time.monotonic() - began)
    except RuntimeError as exc:
        run.check = f"FAILED: {exc}"
    finally:
        probe.close()
        if kind == "ktm":
            launched.terminate()
        run.finished = launched.wait(STOP_TIMEOUT_S)
        delete_topic(cluster.src, topics[0])
        delete_topic(cluster.dst, topics[1])
    return finish_latency(run)


def wait_first_epoch(launched: Launched, timeout: float) -> None:
    """ktm's first epoch pays for Python worker start-up: measure after it, in steady state."""
    deadline = time.monotonic() + timeout
    while not EPOCH_RE.search(launched.stderr_text()):
        if launched.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"ktm finished no epoch within {timeout:.0f} s")
        time.sleep(0.5)


def finish_latency(run: LatencyRun) -> LatencyRun:
    lat, finished = run.lat, run.finished
    if run.check == "ok" and lat is not None:
        if lat.unique < lat.sent:
            run.check = f"WRONG: {lat.sent - lat.unique} of {lat.sent} records missing"
        elif len(lat.millis) > lat.unique:
            run.check = f"{len(lat.millis) - lat.unique} duplicates"
    if finished is not None and finished.returncode != 0 and run.check == "ok":
        run.check = f"exit code {finished.returncode}"
    if run.check != "ok" and finished is not None:
        tail = "\n    ".join(finished.stderr.strip().splitlines()[-10:])
        print(f"  {run.kind}: {run.check}; last lines of its stderr:\n    {tail}")
    return run


LATENCY_HEADERS = [
    "contender", "sent", "achieved rate/s", "p50 ms", "p99 ms", "max ms", "probe backlog",
    "warm-up s", "CPU cores busy", "peak RSS MB", "check",
]  # fmt: skip


def latency_cells(run: LatencyRun) -> list[str]:
    lat, mon = run.lat, run.finished.monitor if run.finished else None
    if lat is None:
        return [LABELS[run.kind], *["-"] * 9, run.check]
    return [
        LABELS[run.kind].replace(" (whole process)", " (continuous)"),
        str(lat.sent),
        f"{rate(lat.sent, lat.send_seconds):,.0f}",
        lat.pct(0.50),
        lat.pct(0.99),
        f"{lat.millis[-1]:.0f}" if lat.millis else "-",
        str(lat.probe_backlog),
        f"{run.warm_up:.1f}",
        f"{run.cpu_share:.2f}" if run.cpu_share is not None else "-",
        mb(mon.peak_rss) if mon else "-",
        run.check,
    ]


def section_latency(cluster: Cluster, workdir: Path, args: argparse.Namespace) -> bool:
    kinds = [k for k in args.only if k != "confluent"]  # the issue asks for ktm and the naive loop
    runs = []
    for kind in kinds:
        print(
            f"\n[latency] {kind}: {args.latency_rate:.0f}/s for {args.latency_seconds:.0f} s "
            f"(load average {load_average()}) ..."
        )
        runs.append(run_latency(kind, cluster, workdir, args))
    title = (
        f"LATENCY at {args.latency_rate:.0f} records/s for {args.latency_seconds:.0f} s, "
        f"{args.size} B, "
        f"{args.partitions} partitions: destination consumer's wall clock - source CreateTime "
        "(an upper bound of source timestamp -> destination ack; includes up to 20 ms fetch wait "
        "of the measuring consumer)"
    )
    print_table(title, LATENCY_HEADERS, [latency_cells(r) for r in runs])
    print(
        "probe backlog = most records already in the destination that the measuring consumer "
        "had not read yet (large: the probe, not the relay, was late). warm-up s (not measured) = "
        "from starting the relay until it passed a record on every partition, and for ktm "
        "until its first epoch (Python worker start-up) ended. "
        "achieved rate < the target: the probe's producer fell behind. CPU cores busy = CPU "
        f"seconds of the relay's process tree per second while measuring (of {os.cpu_count()})."
    )
    return all(r.check == "ok" for r in runs)


# ---- section 3: ktm's scaling with partitions ---------------------------------------------------

SCALING_HEADERS = [
    "partitions", "Spark master", "process s", "records/s whole", "records/s steady",
    "steady vs first", "Spark start s", "epochs", "epoch overhead", "peak RSS MB", "peak PSS MB",
    "CPU s", "copy check",
]  # fmt: skip


def scaling_cells(partitions: int, outcome: Finished | str, records: int, base: float) -> list[str]:
    master = f"local[{max(2, partitions + 1)}]"  # relay.engine.default_master
    if isinstance(outcome, str):
        return [str(partitions), master, *["-"] * 10, outcome]
    parsed = KtmLog.parse(outcome.stderr)
    steady = parsed.steady()
    steady_rate = rate(*steady) if steady else None
    epochs_s = (parsed.relay_seconds or 0) - (parsed.spark_start or 0)
    share = f"{100 * parsed.overhead / epochs_s:.0f}%" if parsed.overhead and epochs_s > 0 else "-"
    mon = outcome.monitor
    return [
        str(partitions),
        master,
        f"{outcome.wall:.1f}",
        f"{rate(records, outcome.wall):,.0f}",
        (f"{steady_rate:,.0f}" + (" *" if parsed.steady_is_thin else "")) if steady_rate else "n/a",
        f"{steady_rate / base:.2f}x" if steady_rate and base else "-",
        f"{parsed.spark_start:.1f}" if parsed.spark_start is not None else "-",
        str(len(parsed.epochs)),
        share,
        mb(mon.peak_rss),
        mb(mon.peak_pss),
        f"{mon.cpu_seconds:.1f}" if mon.cpu_seconds is not None else "-",
        outcome.check,
    ]


def section_scaling(cluster: Cluster, workdir: Path, args: argparse.Namespace) -> bool:
    outcomes: list[tuple[int, Finished | str]] = []
    for partitions in args.scaling:
        print(
            f"\n[scaling] ktm with {partitions} partitions, {args.scaling_records} records "
            f"(load average {load_average()})"
        )
        work = prepare_source(cluster, partitions, args.scaling_records, args)
        try:
            outcomes.append((partitions, run_throughput("ktm", cluster, workdir, work, args)))
        finally:
            delete_topic(cluster.src, work.source)
    steady = [KtmLog.parse(o.stderr).steady() for _, o in outcomes if not isinstance(o, str)] or [
        None
    ]
    base = rate(*steady[0]) if steady[0] else 0.0
    rows = [scaling_cells(p, o, args.scaling_records, base) for p, o in outcomes]
    title = (
        f"SCALING: ktm relay --stop-at-end, {args.scaling_records} records x {args.size} B "
        f"(Spark master is ktm's default: one slot per partition + 1; {os.cpu_count()} CPUs)"
    )
    print_table(title, SCALING_HEADERS, rows)
    print("steady vs first = steady-state records/s relative to the first row.")
    if any("*" in row[4] for row in rows):
        print(THIN_STEADY)
    return all(not isinstance(o, str) and o.check == "ok" for _, o in outcomes)


# ---- command line -------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def contender_list(text: str) -> list[str]:
    kinds = [x.strip() for x in text.split(",") if x.strip()]
    unknown = set(kinds) - set(CONTENDERS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown contender(s) {sorted(unknown)}; {CONTENDERS}")
    return kinds


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--records", type=int, default=500_000, help="records for the throughput runs")
    add("--size", type=int, default=100, help="value size in bytes (e.g. 1024), at least 16")
    add("--partitions", type=int, default=4, help="source partitions (throughput, latency)")
    add("--only", type=contender_list, default=list(CONTENDERS), help="ktm,naive,confluent")
    add("--epoch-duration", default="5s", help="ktm's [spark] epoch_duration")
    add("--latency-rate", type=float, default=5000.0, help="records/s produced while timing")
    add("--latency-seconds", type=float, default=20.0)
    add("--scaling", type=int_list, default=[1, 2, 4, 8], help="partition counts for ktm")
    add("--scaling-records", type=int, default=None, help="default: min(200000, --records)")
    add("--skip-throughput", action="store_true")
    add("--skip-latency", action="store_true")
    add("--skip-scaling", action="store_true")
    args = parser.parse_args(argv)
    if args.size < 16:
        parser.error("--size must be at least 16 (each value starts with its sequence number)")
    if args.scaling_records is None:
        args.scaling_records = min(200_000, args.records)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not KTM.exists() and "ktm" in args.only:
        print(f"no ktm next to {sys.executable}: run this with the venv ktm is installed in")
        return 2
    print_header(args)
    workdir = Path(tempfile.mkdtemp(prefix="ktm-bench-"))
    ok = True
    with Cluster(workdir) as cluster:
        if not args.skip_throughput:
            ok &= section_throughput(cluster, workdir, args)
        if not args.skip_latency:
            ok &= section_latency(cluster, workdir, args)
        if not args.skip_scaling and "ktm" in args.only:
            ok &= section_scaling(cluster, workdir, args)
    print(f"\nload average at the end: {load_average()} ({os.cpu_count()} CPUs)")
    print(f"logs of every run (contenders' stdout/stderr, brokers): {workdir}")
    if not ok:
        print("SOME RUNS FAILED OR COPIED WRONG DATA: see the check columns")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
