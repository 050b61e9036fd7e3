"""Two local Tansu brokers (source and target cluster) with demo data, to try ktm by hand.

    python scripts/local_brokers.py start      # source 127.0.0.1:19092, target 127.0.0.1:19093
    python scripts/local_brokers.py count --bootstrap 127.0.0.1:19093 --topic demo-copy
    python scripts/local_brokers.py status | stop

The brokers keep everything in memory: stopping them loses all data. Their logs and PIDs live in
.ktm/brokers/ at the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file, the testbed package beside scripts/ is not found
    sys.path.insert(0, str(ROOT))

from testbed.ports import port_is_free  # noqa: E402
from testbed.records import Record, produce, read_all  # noqa: E402
from testbed.tansu import BrokerStartError, TansuBroker  # noqa: E402
from testbed.topics import create_topic  # noqa: E402

STATE_DIR = ROOT / ".ktm" / "brokers"
PIDS_FILE = STATE_DIR / "pids.json"
STOP_GRACE_S = 5.0
VALUE_BYTES = 100


def bootstrap(port: int) -> str:
    return f"127.0.0.1:{port}"


def is_alive(pid: int) -> bool:
    """True if ``pid`` is a live Tansu process (a recycled PID or a zombie does not count)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    return not cmdline.exists() or b"tansu" in cmdline.read_bytes()


def read_state() -> dict[str, dict[str, int]]:
    return json.loads(PIDS_FILE.read_text()) if PIDS_FILE.exists() else {}


def demo_value(seq: int, key: str) -> bytes:
    """A JSON object of exactly VALUE_BYTES bytes."""
    fields = {"seq": seq, "user": key, "event": "click", "pad": ""}
    fields["pad"] = "x" * (VALUE_BYTES - len(json.dumps(fields, separators=(",", ":"))))
    return json.dumps(fields, separators=(",", ":")).encode()


def produce_demo(address: str, topic: str, count: int, partitions: int) -> None:
    """``count`` records of 500 users; a user's records always land in the same partition."""
    first_ms = int(time.time() * 1000) - count
    records = [
        Record(
            key=f"user-{seq % 500}",
            value=demo_value(seq, f"user-{seq % 500}"),
            headers=[("source", b"demo")],
            partition=(seq % 500) % partitions,
            timestamp_ms=first_ms + seq,
        )
        for seq in range(count)
    ]
    produce(address, topic, records, linger_ms=20)


def count_records(address: str, topic: str, timeout: float = 30.0) -> dict[int, int] | None:
    """Records per partition, read to the real end (testbed.records.read_all); None if the
    topic does not exist."""
    try:
        found = read_all(address, topic, timeout=timeout)
    except LookupError:
        return None
    return {partition: len(records) for partition, records in sorted(found.items())}


def start_brokers(ports: dict[str, int]) -> bool:
    """Start the brokers (detached: they outlive this script), record their PIDs, and wait
    until each answers."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    state: dict[str, dict[str, int]] = {}
    try:
        for name, port in ports.items():
            broker = TansuBroker(f"ktm-{name}", port=port, log_dir=STATE_DIR, detach=True)
            broker.start(timeout=10.0)
            state[name] = {"pid": broker.pid or 0, "port": port}
    except BrokerStartError as exc:
        print(exc)
        return False
    finally:
        PIDS_FILE.write_text(json.dumps(state))
    return True


def cmd_start(args: argparse.Namespace) -> int:
    state = read_state()
    if state and all(is_alive(info["pid"]) for info in state.values()):
        print("already running:")
        return cmd_status(args)
    cmd_stop(args)  # clears a half-running or stale set
    ports = {"source": args.source_port, "target": args.target_port}
    busy = [str(port) for port in ports.values() if not port_is_free(port)]
    if busy:
        print(f"port(s) in use: {', '.join(busy)} (choose others: --source-port, --target-port)")
        return 1
    if not start_brokers(ports):
        cmd_stop(args)
        return 1
    source, target = bootstrap(args.source_port), bootstrap(args.target_port)
    create_topic(source, args.topic, args.partitions)
    create_topic(target, args.target_topic, args.partitions)
    produce_demo(source, args.topic, args.demo_records, args.partitions)
    print(f"source: {source}  topic {args.topic!r}: {args.demo_records} records")
    print(f"target: {target}  topic {args.target_topic!r}: empty")
    print(f"logs:   {STATE_DIR}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    state = read_state()
    alive = {name: info["pid"] for name, info in state.items() if is_alive(info["pid"])}
    for pid in alive.values():
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S  # Tansu waits ~5 s for connected clients
    while any(is_alive(pid) for pid in alive.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for name, pid in alive.items():
        if is_alive(pid):
            os.kill(pid, signal.SIGKILL)
        print(f"stopped {name} (pid {pid})")
    PIDS_FILE.unlink(missing_ok=True)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = read_state()
    if not state:
        print("no brokers started (run: start)")
    for name, info in state.items():
        up = is_alive(info["pid"])
        print(f"{name}: {'up' if up else 'down'}  {bootstrap(info['port'])}  pid {info['pid']}")
    return 0


def cmd_count(args: argparse.Namespace) -> int:
    counts = count_records(args.bootstrap, args.topic)
    if counts is None:
        print(f"topic {args.topic!r} does not exist on {args.bootstrap}")
        return 1
    for partition, count in counts.items():
        print(f"partition {partition}: {count}")
    print(f"total: {sum(counts.values())}")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start both brokers and load demo records")
    start.add_argument("--source-port", type=int, default=19092)
    start.add_argument("--target-port", type=int, default=19093)
    start.add_argument("--demo-records", type=int, default=10000)
    start.add_argument("--topic", default="demo")
    start.add_argument("--target-topic", default="demo-copy")
    start.add_argument("--partitions", type=int, default=4)
    start.set_defaults(run=cmd_start)
    commands.add_parser("stop", help="stop both brokers").set_defaults(run=cmd_stop)
    commands.add_parser("status", help="show which brokers are up").set_defaults(run=cmd_status)
    count = commands.add_parser("count", help="records per partition of a topic")
    count.add_argument("--bootstrap", required=True)
    count.add_argument("--topic", required=True)
    count.set_defaults(run=cmd_count)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
