"""Command-line options. Every size has a full default and a --quick default (a smoke run that
checks each section end to end in seconds); an explicit flag wins over both."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from scripts.bench.brokers import BROKER_KINDS
from scripts.bench.contenders import CONTENDERS

SECTIONS = (
    "throughput",
    "steady",
    "partitions",
    "latency",
    "rates",
    "idle",
    "metrics_lag",
    "stop",
    "first_record",
    "scaling",
    "store",
    "roundtrip",
    "channel",
    "groups",
    "links",
    "scale",
    "verify",
    "verify_follow",
    "rolling",
)
# optional: big backlogs, several Spark runs (rolling: a three-node cluster and its restart)
OPTIONAL = ("scaling", "rates", "links", "scale", "verify", "verify_follow", "rolling")
DEFAULT_SECTIONS = tuple(s for s in SECTIONS if s not in OPTIONAL)
STORE_KINDS = ("dir", "s3")


@dataclass(frozen=True)
class Options:
    sections: tuple[str, ...]
    contenders: tuple[str, ...]
    records: tuple[int, ...]  # throughput sizes
    size: int  # value bytes
    partitions: int  # throughput, steady, latency, metrics_lag, stop, first_record
    steady_records: int
    many: tuple[tuple[int, int], ...]  # (partitions, records) for the partitions section
    rate: float  # records/s fed to a running relay (latency, metrics_lag, stop)
    seconds: float  # how long (latency, metrics_lag)
    stop_after: float  # seconds of flowing records before the stop signal
    first_records: int  # backlog waiting when ktm starts (first_record)
    scaling: tuple[int, ...]
    scaling_records: int
    ktm_set: tuple[str, ...]
    quick: bool
    store_cases: tuple[tuple[int, int], ...]  # (partitions, records) for the store section
    roundtrip_records: int  # in `partitions` partitions
    stores: tuple[str, ...]  # where backups go: a local directory and/or S3 (SeaweedFS)
    scale_cases: tuple[tuple[int, int], ...] = ()  # (topics of 5 partitions, records)
    groups_cases: tuple[tuple[int, int, int], ...] = ()  # (groups, partitions, per group)
    repeat: int = 1  # runs of each section; tables show the median and range
    verify_records: tuple[int, ...] = ()  # records the verify section proves, case by case
    brokers: str = "tansu"  # the source's and destination's kind: tansu or kafka
    rolling_records: int = 1_000_000  # copied once undisturbed, once through a rolling restart
    rates: tuple[float, ...] = ()  # the rates section: records/s, each for `seconds`


# option: (full run, --quick). --quick keeps every section's shape (partition counts included)
# and shrinks the data: each section then takes seconds, plus a Spark start per ktm run.
PRESETS: dict[str, tuple[Any, Any]] = {
    "records": ((100_000, 300_000), (20_000,)),
    "steady_records": (1_000_000, 400_000),
    "many": (((48, 96_000), (256, 128_000)), ((48, 9_600), (256, 12_800))),
    "rate": (5000.0, 1000.0),
    "seconds": (20.0, 5.0),
    "stop_after": (5.0, 2.0),
    "first_records": (10_000, 2_000),
    "scaling": ((1, 2, 4, 8), (1, 2)),
    "scaling_records": (400_000, 300_000),
    "store_cases": (((4, 300_000), (48, 96_000)), ((4, 20_000), (48, 9_600))),
    "roundtrip_records": (1_000_000, 60_000),
    "scale_cases": (((400, 120_000), (400, 1_200_000)), ((40, 12_000),)),
    "groups_cases": (((20, 16, 16),), ((20, 16, 16),)),
    "verify_records": ((1_000_000,), (50_000,)),
    "rolling_records": (1_000_000, 100_000),
    "rates": ((100.0, 1000.0, 5000.0, 100_000.0), (100.0, 1000.0)),
}


def names(allowed: tuple[str, ...]) -> argparse._ActionType:
    def parse(text: str) -> tuple[str, ...]:
        chosen = tuple(x.strip() for x in text.split(",") if x.strip())
        unknown = sorted(set(chosen) - set(allowed))
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {','.join(allowed)}")
        return chosen

    return parse


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def cases(text: str) -> tuple[tuple[int, int], ...]:
    """'48:96000,256:128000' -> ((48, 96000), (256, 128000))"""
    pairs = [item.split(":") for item in text.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise argparse.ArgumentTypeError("expected PARTITIONS:RECORDS[,PARTITIONS:RECORDS...]")
    return tuple((int(p), int(r)) for p, r in pairs)


def triples(text: str) -> tuple[tuple[int, int, int], ...]:
    """'20:16:16,200:2000:10' -> ((20, 16, 16), (200, 2000, 10))"""
    parts = [item.split(":") for item in text.split(",") if item.strip()]
    if any(len(part) != 3 for part in parts):
        raise argparse.ArgumentTypeError("expected A:B:C[,A:B:C...]")
    return tuple((int(a), int(b), int(c)) for a, b, c in parts)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench",
        description="Benchmark ktm against plain consume/produce loops on local brokers "
        "(Tansu or Apache Kafka) started here.",
    )
    add = p.add_argument
    add(
        "--sections",
        type=names(SECTIONS),
        default=DEFAULT_SECTIONS,
        help=f"comma-separated, of: {','.join(SECTIONS)} (default: all but "
        f"{','.join(OPTIONAL)}). rolling: a copy into a three-node Apache Kafka cluster, "
        "undisturbed and through a rolling restart",
    )
    add(
        "--brokers",
        choices=BROKER_KINDS,
        default="tansu",
        help="the source and the destination: one Tansu broker each, or one single-node "
        "Apache Kafka 4.4 cluster each (full JIT; started, stopped and removed here) [tansu]",
    )
    add(
        "--contenders",
        type=names(CONTENDERS),
        default=CONTENDERS,
        help="ktm,naive,confluent,tuned (the confluent-kafka loops are skipped if not installed)",
    )
    add("--quick", action="store_true", help="small sizes: a smoke run of every section")
    add(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run each section N times; tables show each number's median (min-max) [1]",
    )
    add("--records", type=ints, help="throughput sizes, e.g. 100000,300000")
    add("--size", type=int, default=100, help="value bytes (>= 16) [100]")
    add("--partitions", type=int, default=4, help="partitions of all but the many/scaling runs")
    add("--steady-records", type=int, help="backlog for the steady state [1000000]")
    add(
        "--many",
        type=cases,
        help="partitions section: PARTITIONS:RECORDS,... [48:96000,256:128000]",
    )
    add("--rate", type=float, help="records/s fed to a running relay [5000]")
    add("--rates", type=floats, help="rates section: records/s [100,1000,5000,100000]")
    add("--seconds", type=float, help="seconds of feed for latency, rates, metrics_lag [20]")
    add("--stop-after", type=float, help="seconds of flowing data before the stop signal [5]")
    add("--first-records", type=int, help="backlog waiting for first_record [10000]")
    add("--scaling", type=ints, help="partition counts for scaling [1,2,4,8]")
    add("--scaling-records", type=int, help="backlog per scaling run [400000]")
    add(
        "--ktm-set",
        action="append",
        default=[],
        metavar="SECTION.KEY=TOML",
        help="extra ktm config (TOML value), e.g. --ktm-set spark.slots=4",
    )
    add_store_options(p)
    return p


def add_store_options(p: argparse.ArgumentParser) -> None:
    """The store and roundtrip sections' options."""
    p.add_argument(
        "--store-cases",
        type=cases,
        help="store section: PARTITIONS:RECORDS,... [4:300000,48:96000]",
    )
    p.add_argument(
        "--roundtrip-records",
        type=int,
        help="roundtrip backlog, in --partitions partitions [1000000]",
    )
    p.add_argument(
        "--groups-cases",
        type=triples,
        help="groups section: GROUPS:PARTITIONS:PER_GROUP,... [20:16:16]; 200:2000:10: 200 "
        "groups on 10 partitions each of a 2,000-partition topic",
    )
    p.add_argument(
        "--scale-cases",
        type=cases,
        help="scale section: TOPICS:RECORDS,... (5 partitions a topic) [400:120000,400:1200000]",
    )
    p.add_argument(
        "--verify-records",
        type=ints,
        help="verify section: the backlogs ktm verify proves, e.g. 1000000,10000000 [1000000]",
    )
    p.add_argument(
        "--rolling-records",
        type=int,
        help="rolling section: records of each copy [1000000]",
    )
    p.add_argument(
        "--store",
        type=names(STORE_KINDS),
        default=("dir",),
        help="where store/roundtrip back up to: dir (a local directory), s3 (a SeaweedFS "
        "server started here), or dir,s3 [dir]",
    )


def parse_args(argv: list[str] | None = None) -> Options:
    p = parser()
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.size < 16:
        p.error("--size must be at least 16 (each value starts with its sequence number)")
    for item in args.ktm_set:
        if "=" not in item or "." not in item.partition("=")[0]:
            p.error(f"--ktm-set {item!r}: expected SECTION.KEY=VALUE, e.g. spark.slots=4")

    def pick(name: str) -> Any:
        given = getattr(args, name)
        return PRESETS[name][args.quick] if given is None else given

    return Options(
        sections=args.sections,
        contenders=args.contenders,
        records=pick("records"),
        size=args.size,
        partitions=args.partitions,
        steady_records=pick("steady_records"),
        many=pick("many"),
        rate=pick("rate"),
        seconds=pick("seconds"),
        stop_after=pick("stop_after"),
        first_records=pick("first_records"),
        scaling=pick("scaling"),
        scaling_records=pick("scaling_records"),
        ktm_set=tuple(args.ktm_set),
        quick=args.quick,
        store_cases=pick("store_cases"),
        roundtrip_records=pick("roundtrip_records"),
        stores=args.store,
        scale_cases=pick("scale_cases"),
        groups_cases=pick("groups_cases"),
        repeat=args.repeat,
        verify_records=pick("verify_records"),
        brokers=args.brokers,
        rolling_records=pick("rolling_records"),
        rates=pick("rates"),
    )
