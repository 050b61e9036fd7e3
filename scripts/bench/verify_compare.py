"""`python -m scripts.bench.verify_compare [--records N] [--runs 3]`: CPU per record of ktm
verify's comparison alone, no broker involved.

A source partition of N records (100-byte values, a key, two headers) in batches of 500, and
the destination a relay writes for it (`relay.batches.rebuild`: each source batch copied whole
but for its last record, renumbered from 0). One `Checker` takes every destination record's
claim and reads the source alongside, (a) record by record, (b) a destination batch that
copied a source batch whole compared whole (what `ktm verify` does). Prints the median and
range of the runs, in µs per record and records per second.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import time

from relay.batches import Origin, rebuild, split_batches
from relay.batches.format import SourceBatch
from relay.pipelines.verify.compare import Checker
from relay.pipelines.verify.records import BatchClaim, Claim, claims, expected
from relay.pipelines.verify.spec import Feeder, Scope
from scripts.bench.data import record_fields
from scripts.bench.machine import code_version, cpu_model, load_average

PER_BATCH = 500
KEY = ("bench", 0)


def source_batches(records: int) -> list[SourceBatch]:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    out = b""
    for first in range(0, records, PER_BATCH):
        builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, batch_size=1 << 30)
        for offset in range(first, min(first + PER_BATCH, records)):
            f = record_fields(offset, 100, 1)
            builder.append(offset - first, 1_700_000_000_000 + offset, f["key"], f["value"],
                           f["headers"])  # fmt: skip
        buf = builder.build()
        struct.pack_into(">q", buf, 0, first)
        out += bytes(buf)
    return split_batches(out)[0]


def destination(source: list[SourceBatch]) -> list[SourceBatch]:
    out, at = b"", 0
    for dest in rebuild(source, 0, Origin("src", *KEY)).batches:
        payload = bytearray(dest.payload)
        struct.pack_into(">q", payload, 0, at)
        out += bytes(payload)
        at += dest.count
    return split_batches(out)[0]


def one_run(source: list[SourceBatch], dest: list[SourceBatch], whole: bool) -> float:
    """Seconds to check every record; asserts the copy verified exact."""
    feeder = Feeder(KEY, 0, source[-1].next_offset)
    began = time.process_time()
    checker = Checker(feeder, ("copy", 0), expected([source], feeder, Scope(), None), Scope())
    for batch in dest:
        for claim in claims(batch, None, whole):
            for one in _expanded(claim, checker):
                checker.claim(one.source_offset, one.dest_offset, one.copy)
    report = checker.finish()
    took = time.process_time() - began
    assert report.exact and report.equal == feeder.end, report
    return took


def _expanded(claim: Claim | BatchClaim, checker: Checker) -> list[Claim]:
    if not isinstance(claim, BatchClaim):
        return [claim]
    start = checker.claim_whole(claim)
    return [claim.last_claim(start)] if start is not None else list(claim.claims())


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.verify_compare")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    source = source_batches(args.records)
    dest = destination(source)
    print(f"verify comparison, {args.records:,} records in batches of {PER_BATCH}, CPU time; "
          f"{cpu_model()}, load {load_average()}, {code_version()}")  # fmt: skip
    for label, whole in (("record by record", False), ("whole batches", True)):
        times = [one_run(source, dest, whole) for _ in range(args.runs)]
        per = sorted(t / args.records * 1e6 for t in times)
        rate = args.records / statistics.median(times)
        print(f"  {label:17} {statistics.median(per):.2f} µs/record ({per[0]:.2f}-{per[-1]:.2f})"
              f", {rate:,.0f} records/s")  # fmt: skip


if __name__ == "__main__":
    main()
