"""`python -m scripts.bench.batch_codec [--records N] [--runs 3]`: CPU per record of turning
fetched source batches into destination batches, no broker involved.

(a) today's path: kafka-python decodes every record into an object (`DefaultRecordBatch`), the
    relay appends a `ktm.src` header per record, and `DefaultRecordBatchBuilder` encodes them
    again into batches of up to 256 KiB. Only the codec work: the consumer's ConsumerRecord
    objects, deserializers and the producer's per-record bookkeeping come on top in the relay;
(b) the batch path: `relay.batches.split_batches` + `rebuild` (provenance per batch);
(c) only if aiokafka is importable: (a) with aiokafka's Cython record codec in place of
    kafka-python's (aiokafka is no dependency of ktm: run this in a throwaway venv to see it).

Data: the benchmark's records (scripts/bench/data.py: 100-byte values, a key, two headers),
4 partitions x N records, in source batches of 1 record or of ~500 records, uncompressed or
compressed; the destination uses the source's codec. Prints the median and range of the runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import struct
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder

from relay.batches import Origin, codecs, rebuild, split_batches
from scripts.bench.data import record_fields
from scripts.bench.machine import code_version, cpu_model, load_average, ram_gib

PARTITIONS = 4
BUDGET = 256 * 1024
CASES = [  # (source codec, records per source batch)
    ("none", 1),
    ("none", 500),
    ("lz4", 1),
    ("lz4", 500),
    ("zstd", 1),
    ("zstd", 500),
]
T0 = 1_700_000_000_000


def source_partition(partition: int, count: int, per_batch: int, codec: str) -> bytes:
    """What a fetch of one partition returns: batches as kafka-python's producer builds them."""
    out = []
    for base in range(0, count, per_batch):
        builder = DefaultRecordBatchBuilder(2, codecs.BY_NAME[codec], False, -1, -1, -1, 1 << 30)
        for delta in range(min(per_batch, count - base)):
            fields = record_fields((base + delta) * PARTITIONS + partition, 100, PARTITIONS)
            timestamp = T0 + base + delta
            builder.append(delta, timestamp, fields["key"], fields["value"], fields["headers"])
        batch = builder.build()
        struct.pack_into(">q", batch, 0, base)
        out.append(bytes(batch))
    return b"".join(out)


def record_path(codec_module: Any) -> Callable[[int, bytes, int], int]:
    """Today's work per fetch, with a given record codec module (kafka-python's or aiokafka's)."""
    batch_cls, builder_cls = codec_module.DefaultRecordBatch, codec_module.DefaultRecordBatchBuilder

    def run(partition: int, data: bytes, codec: int) -> int:
        prefix = b"src/topic/%d/" % partition
        built = 0
        builder = builder_cls(2, codec, False, -1, -1, -1, BUDGET)
        index = 0
        for batch in _batches(data, batch_cls):
            for r in batch:
                headers = list(r.headers)
                headers.append(("ktm.src", prefix + str(r.offset).encode()))
                if builder.append(index, r.timestamp, r.key, r.value, headers) is None:
                    built += len(builder.build())
                    builder, index = builder_cls(2, codec, False, -1, -1, -1, BUDGET), 0
                    builder.append(index, r.timestamp, r.key, r.value, headers)
                index += 1
        return built + len(builder.build())

    return run


def _batches(data: bytes, batch_cls: Any) -> Any:
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        (length,) = struct.unpack_from(">i", view, pos + 8)
        yield batch_cls(view[pos : pos + 12 + length])
        pos += 12 + length


def batch_path(partition: int, data: bytes, codec: int) -> int:
    batches, _ = split_batches(data)
    rebuilt = rebuild(batches, 0, Origin("src", "topic", partition), codec, BUDGET)
    return sum(len(b.payload) for b in rebuilt.batches)


def cpu_us_per_record(
    path: Callable[[int, bytes, int], int], parts: list[bytes], codec: int, records: int
) -> tuple[float, int]:
    started = time.process_time()
    size = sum(path(p, data, codec) for p, data in enumerate(parts))
    return (time.process_time() - started) * 1e6 / records, size


def _aiokafka() -> ModuleType | None:
    try:
        from aiokafka.record._crecords import default_records
    except ImportError:
        return None
    return default_records


def measure(records: int, runs: int) -> None:
    import kafka.record.default_records as kafka_codec

    paths: dict[str, Callable[[int, bytes, int], int]] = {
        "(a) record path, kafka-python": record_path(kafka_codec),
        "(b) batch path, relay.batches": batch_path,
    }
    aiokafka = _aiokafka()
    if aiokafka is not None:
        paths["(c) record path, aiokafka C"] = record_path(aiokafka)
    per_partition = records // PARTITIONS
    print(f"{'case':<20}{'path':<32}{'median µs/rec':>14}{'range':>14}  dest B/rec (vs source)")
    for codec_name, per_batch in CASES:
        parts = [source_partition(p, per_partition, per_batch, codec_name) for p in range(4)]
        total = per_partition * PARTITIONS
        source_bytes = sum(len(d) for d in parts) / total
        case = f"{codec_name}, {per_batch}/batch"
        for name, path in paths.items():
            codec = codecs.BY_NAME[codec_name]
            cpu_us_per_record(path, parts, codec, total)  # warm-up, not counted
            samples = [cpu_us_per_record(path, parts, codec, total) for _ in range(runs)]
            times = [t for t, _ in samples]
            spread = f"{min(times):.2f}-{max(times):.2f}"
            dest = samples[0][1] / total
            print(
                f"{case:<20}{name:<32}{statistics.median(times):>14.2f}{spread:>14}"
                f"  {dest:8.1f} ({dest / source_bytes - 1:+.1%})"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=40_000, help="records per case, all parts")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    print(
        f"batch codec benchmark {time.strftime('%Y-%m-%d %H:%M:%S')}: {os.cpu_count()} CPUs "
        f"({cpu_model()}), {ram_gib():.1f} GiB RAM, Python {platform.python_version()}, "
        f"load average {load_average()}\n{code_version()}\n"
        f"{args.runs} runs per path and case (after one warm-up), {args.records} records "
        "over 4 partitions, no broker; CPU: time.process_time() of this process"
    )
    measure(args.records, args.runs)


if __name__ == "__main__":
    main()
