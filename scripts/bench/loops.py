"""The baseline relays ktm is compared with: the loop every team writes, in one process.

    python -m scripts.bench.loops naive --src HOST:PORT --dst HOST:PORT --source T --target T2 \
        --partitions 4 --group G [--follow]
    python -m scripts.bench.loops confluent ...same flags...   (needs: pip install confluent-kafka)
    python -m scripts.bench.loops tuned ...same flags...   (confluent-kafka, tuned for latency)
    python -m scripts.bench.loops confluent --pairs pairs.json ...   (many topics: a JSON list of
        [source topic, destination topic, partitions]; --source/--target/--partitions then unused)

Both do, per batch of consumed records: produce each record (same key, value, headers, partition
and timestamp), flush (wait for every ack), commit the source offsets. No Spark. With
--flush-interval S the confluent loop flushes and commits at most every S seconds instead (a
loop over a long link that flushed every batch would wait a round trip per 500 records).

The tuned loop is the one an operator writes for a steady, modest rate: it takes a batch at
least every TUNED_BATCH_S (consume up to 500 records with that timeout), produces it, flushes,
and only then commits, asynchronously; the broker's fetch wait matches (librdkafka's 500 ms
default held records on Tansu).

Without --follow a loop stops when every source partition is at its real end (the high
watermark of a fetch; Tansu's ListOffsets under-reports it). With --follow it relays until
SIGTERM or SIGINT, then finishes its batch and exits 0. The last stdout line is a JSON summary:
records relayed and the loop's own seconds (interpreter start and imports excluded).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

CONSUME_BATCH = 500  # kafka-python's default max_poll_records; the confluent loop matches it
TUNED_BATCH_S = 0.05  # the tuned loop: a batch at least this often


class Progress:
    """Counts relayed records; a signal only sets a flag, the loop stops between batches."""

    def __init__(self) -> None:
        self.records = 0
        self.started = time.monotonic()
        self.stopped = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, _signum: int, _frame: Any) -> None:
        self.stopped = True

    def summary(self) -> str:
        seconds = time.monotonic() - self.started
        return json.dumps({"records": self.records, "loop_seconds": round(seconds, 3)})


def run_naive(args: argparse.Namespace) -> Progress:
    """kafka-python: KafkaConsumer (assign, from the beginning) -> KafkaProducer(acks=all)."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    tps = [TopicPartition(topic, p) for topic, _, count in args.pairs for p in range(count)]
    consumer = KafkaConsumer(
        bootstrap_servers=args.src,
        group_id=args.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    producer = KafkaProducer(bootstrap_servers=args.dst, acks="all", linger_ms=5)
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    progress = Progress()
    try:
        while not progress.stopped:
            progress.records += _naive_batch(args.targets, consumer, producer)
            if not args.follow and _naive_at_end(consumer, tps):
                break
    finally:
        producer.close()
        consumer.close(autocommit=False)
    return progress


def _naive_batch(targets: dict[str, str], consumer: Any, producer: Any) -> int:
    futures = [
        producer.send(
            targets[r.topic],
            key=r.key,
            value=r.value,
            headers=r.headers,
            partition=r.partition,
            timestamp_ms=r.timestamp,
        )
        for records in consumer.poll(timeout_ms=500).values()
        for r in records
    ]
    if not futures:
        return 0
    producer.flush()
    for future in futures:
        if future.failed():
            raise RuntimeError(f"produce failed: {future.exception}")
    consumer.commit()
    return len(futures)


def _naive_at_end(consumer: Any, tps: list[Any]) -> bool:
    for tp in tps:
        highwater = consumer.highwater(tp)  # None until a fetch for tp has returned
        if highwater is None or consumer.position(tp) < highwater:
            return False
    return True


def run_confluent(args: argparse.Namespace, tuned: bool = False) -> Progress:
    """confluent-kafka (librdkafka): Consumer (assign, from the beginning) -> Producer."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    quiet = {"log_level": 3}  # librdkafka logs every disconnect at level 6 otherwise
    consumer = Consumer(
        {
            "bootstrap.servers": args.src,
            "group.id": args.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,  # an event when a fetch reaches the high watermark
            # On Tansu, librdkafka's default (500 ms) showed as latency: p50 ~130 ms at 1,000
            # records/s, ~30 ms with 50 ms (the kafka-python loop is not affected). 100 ms:
            # what ktm's own reader waits (relay/clients/consumer.py).
            "fetch.wait.max.ms": int(TUNED_BATCH_S * 1000) if tuned else 100,
            **quiet,
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": args.dst,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            **quiet,
        }
    )
    consumer.assign(
        [
            TopicPartition(topic, p, OFFSET_BEGINNING)
            for topic, _, count in args.pairs
            for p in range(count)
        ]
    )
    total = sum(count for _, _, count in args.pairs)
    progress = Progress()
    at_end: set[tuple[str, int]] = set()
    flushed_at = time.monotonic()
    take = _batch_of if tuned else _available
    try:
        while not progress.stopped:
            flush = time.monotonic() - flushed_at >= args.flush_interval
            records = _confluent_batch(args.targets, consumer, producer, at_end, take(consumer))
            if records and flush:
                _settle(producer, consumer, asynchronous=tuned)
            progress.records += records
            flushed_at = time.monotonic() if flush else flushed_at
            if not args.follow and len(at_end) == total:
                break
        _settle(producer, consumer)
    finally:
        producer.flush(30)
        consumer.close()
    return progress


def _confluent_batch(
    targets: dict[str, str],
    consumer: Any,
    producer: Any,
    at_end: set[tuple[str, int]],
    messages: list[Any],
) -> int:
    """Produces what was consumed; the caller flushes and commits."""
    from confluent_kafka import KafkaError

    count = 0
    for msg in messages:
        error = msg.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                raise RuntimeError(f"consume failed: {error}")
            at_end.add((msg.topic(), msg.partition()))
            continue
        at_end.discard((msg.topic(), msg.partition()))
        record = {
            "value": msg.value(),
            "key": msg.key(),
            "headers": msg.headers(),
            "partition": msg.partition(),
            "timestamp": msg.timestamp()[1],
        }
        while True:
            try:
                producer.produce(targets[msg.topic()], **record)
                break
            except BufferError:  # librdkafka's queue is full: let deliveries drain it
                producer.poll(0.05)
        producer.poll(0)  # serve delivery reports; keeps the local queue short
        count += 1
    return count


def _settle(producer: Any, consumer: Any, asynchronous: bool = False) -> None:
    """Every record produced so far acknowledged, then the source offsets committed."""
    left = producer.flush(60)
    if left:
        raise RuntimeError(f"{left} records not acknowledged within 60 s")
    try:
        consumer.commit(asynchronous=asynchronous)
    except Exception as exc:  # nothing consumed since the last commit: nothing to commit
        if "NO_OFFSET" not in str(exc):
            raise


def _available(consumer: Any) -> list[Any]:
    """Up to CONSUME_BATCH messages, as soon as one is there: kafka-python's poll() semantics.
    consume(CONSUME_BATCH, timeout) alone waits for a full batch or the timeout, which at a
    low rate held each record up to 0.5 s (a latency p50 of ~350 ms at 1,000 records/s)."""
    first = consumer.consume(num_messages=1, timeout=0.5)
    if not first:
        return []
    return first + consumer.consume(num_messages=CONSUME_BATCH - 1, timeout=0)


def _batch_of(consumer: Any) -> list[Any]:
    """The tuned loop's batch: up to CONSUME_BATCH messages, whatever came within TUNED_BATCH_S."""
    return list(consumer.consume(num_messages=CONSUME_BATCH, timeout=TUNED_BATCH_S))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("kind", choices=["naive", "confluent", "tuned"])
    parser.add_argument("--src", required=True, help="source bootstrap host:port")
    parser.add_argument("--dst", required=True, help="destination bootstrap host:port")
    parser.add_argument("--source", help="source topic")
    parser.add_argument("--target", help="destination topic (same partitions)")
    parser.add_argument("--partitions", type=int)
    parser.add_argument("--pairs", help="JSON file: [[source, destination, partitions], ...]")
    parser.add_argument("--group", required=True, help="consumer group for the commits")
    parser.add_argument("--follow", action="store_true", help="relay until SIGTERM/SIGINT")
    parser.add_argument(
        "--flush-interval",
        type=float,
        default=0.0,
        help="confluent: flush and commit at most every this many seconds [0: every batch]",
    )
    args = parser.parse_args(argv)
    if args.pairs:
        args.pairs = [tuple(pair) for pair in json.loads(Path(args.pairs).read_text())]
    elif args.source and args.target and args.partitions:
        args.pairs = [(args.source, args.target, args.partitions)]
    else:
        parser.error("give --source, --target and --partitions, or --pairs")
    args.targets = {source: target for source, target, _ in args.pairs}
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.kind in ("confluent", "tuned"):
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            print("confluent-kafka is not installed: pip install confluent-kafka", file=sys.stderr)
            return 3
    if args.kind == "naive":
        progress = run_naive(args)
    else:
        progress = run_confluent(args, tuned=args.kind == "tuned")
    print(progress.summary(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
