"""The control channel between running tasks and the driver: live progress up, "stop" down.

Spark returns a task's result only when the task ends, and a relay task runs until the driver
stops it, so tasks report over this small channel instead. Each task connects to a TCP server on
the driver (executors must reach the driver anyway, so this works on a real cluster), proves it
belongs to this run with a per-run token, then sends every `report_interval` the cumulative
progress of the partitions that moved since its last report; the driver answers each report with
a lease renewal, and may send "stop" at any time. Messages are JSON lines: no secrets travel
(offsets and counts only) and nothing is unpickled from the network.

Why not let tasks commit source offsets and have the driver poll them? That gives progress only
(no way to say "stop"), costs an OffsetCommit per task per interval plus the driver's
OffsetFetches against the source cluster, and the driver's view lags by up to a commit interval
plus a poll interval. Measured by `python -m scripts.bench --sections channel`.

The lease is what keeps a cut-off task from writing: a task that has not heard from the driver
for `lease` seconds (driver frozen, killed, or partitioned away) stops producing on its own.
A *held* round's tasks get a hold instead: they may read ahead, but write nothing until a lease
comes (the first round of a new group, planned while the broker holds the group's first join,
relay.engine.driver.held); a hold not renewed in time ends the task like a lease.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from relay.engine.messages import Json, decode, encode
from relay.spec import ChannelAddress, TaskResult

log = logging.getLogger(__name__)

MAX_LINE = 4 * 1024 * 1024  # a report for thousands of partitions still fits
HELLO_TIMEOUT = 5.0
SEND_TIMEOUT = 2.0


# ---- messages (relay.engine.messages: each a JSON list of its dataclass's fields) -----------


def _send(sock: socket.socket, message: Mapping[str, object]) -> None:
    sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")


def _lines(sock: socket.socket, closed: threading.Event) -> Iterable[dict[str, Json]]:
    """JSON messages from a socket until EOF or `closed`; a line too long or not JSON ends the
    stream. The socket keeps one timeout for sending and receiving (two threads use it, and a
    timeout change would flip the descriptor's blocking mode under the other one)."""
    buffer = b""
    while not closed.is_set():
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield json.loads(line)
        if len(buffer) > MAX_LINE:
            raise ValueError("message too long")


def _int(value: Json) -> int:
    """`int(value)`, typed: a JSON null, list or object raises TypeError as `int` does."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"expected a number, got {value!r}")


def _float(value: Json) -> float:
    """`float(value)`, typed: a JSON null, list or object raises TypeError as `float` does."""
    if isinstance(value, int | float | str):
        return float(value)
    raise TypeError(f"expected a number, got {value!r}")


# ---- driver side ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """A task's message as the driver sees it: live progress, or its final result."""

    round_id: int
    task_id: int
    attempt: int
    result: TaskResult
    final: bool


class ControlServer:
    """Accepts task connections, hands their reports to `on_report`, renews the leases of a
    round's tasks while `lease_for(round)` grants one (else holds them while `hold_for(round)`
    grants that), and tells every task of a round to stop when asked."""

    def __init__(
        self,
        host: str,
        port: int,
        token: str,
        lease_for: Callable[[int], float | None],
        on_report: Callable[[Report], None],
        renew_every: float = 0.5,
        hold_for: Callable[[int], float | None] = lambda _: None,
    ):
        self._token = token
        self._renew_every = renew_every
        # Seconds of writing granted to a round's tasks, or None: no renewal (the driver lost
        # its right to write those partitions).
        self.lease_for = lease_for
        self.hold_for = hold_for  # seconds of reading ahead without writing, or None
        self._on_report = on_report
        self._lock = threading.Lock()
        self._conns: dict[tuple[int, int, int], socket.socket] = {}
        self._stopped_rounds: set[int] = set()
        self._listener = socket.create_server((host, port))
        self._listener.settimeout(0.5)
        self.address = ChannelAddress(host, self._listener.getsockname()[1], token)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="ktm-channel", daemon=True)
        self._thread.start()
        # Leases are renewed on a clock of their own, not only in answer to reports: a task
        # busy with a large fetch must not lose its lease for reporting late.
        self._renewer = threading.Thread(target=self._renew_loop, name="ktm-lease", daemon=True)
        self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._closed.wait(self._renew_every):
            with self._lock:
                conns = list(self._conns.items())
            for (round_id, _, _), conn in conns:
                self._answer(conn, round_id)

    def stop_round(self, round_id: int) -> None:
        """Tell every task of the round to stop (and any that connects later)."""
        with self._lock:
            self._stopped_rounds.add(round_id)
        self.renew(round_id)

    def renew(self, round_id: int) -> None:
        """Answer every task of the round now (a held round's lease, granted)."""
        with self._lock:
            conns = [c for (r, _, _), c in self._conns.items() if r == round_id]
        for conn in conns:
            self._answer(conn, round_id)

    def connected(self, round_id: int) -> int:
        with self._lock:
            return sum(1 for r, _, _ in self._conns if r == round_id)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        try:  # wakes the accept loop at once (it would notice `_closed` within 0.5 s)
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(timeout=2)
        self._renewer.join(timeout=2)
        self._listener.close()
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            _close_socket(conn)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        ident = None
        try:
            conn.settimeout(HELLO_TIMEOUT)
            hello = _first_line(conn)
            ident = self._hello(hello)
            if ident is None:
                return
            conn.settimeout(SEND_TIMEOUT)
            messages = _lines(conn, self._closed)
            with self._lock:
                self._conns[ident] = conn
            self._answer(conn, ident[0])
            for message in messages:
                self._receive(ident, message)
                self._answer(conn, ident[0])
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            log.debug("channel connection %s ended: %s", ident, exc)
        finally:
            if ident is not None:
                with self._lock:
                    if self._conns.get(ident) is conn:
                        del self._conns[ident]
            _close_socket(conn)

    def _hello(self, message: dict[str, Json] | None) -> tuple[int, int, int] | None:
        token = str((message or {}).get("token", ""))
        if not hmac.compare_digest(token.encode(), self._token.encode()):
            log.warning("control channel: refused a connection without this run's token")
            return None
        assert message is not None
        return _int(message["round"]), _int(message["task"]), _int(message["attempt"])

    def _receive(self, ident: tuple[int, int, int], message: dict[str, Json]) -> None:
        result = decode(TaskResult, message["result"])
        self._on_report(Report(*ident, result=result, final=bool(message.get("final"))))

    def _answer(self, conn: socket.socket, round_id: int) -> None:
        with self._lock:
            stop = round_id in self._stopped_rounds
        answer: dict[str, bool | float] = {"stop": stop}
        lease = None if stop else self.lease_for(round_id)
        if lease is not None:
            answer["lease"] = lease
        elif not stop and (hold := self.hold_for(round_id)) is not None:
            answer["hold"] = hold
        try:
            _send(conn, answer)
        except OSError as exc:
            log.debug("channel answer failed: %s", exc)


def _first_line(conn: socket.socket) -> dict[str, Json] | None:
    """The hello, read byte-wise so nothing after it is consumed; None if it does not come."""
    line = b""
    while len(line) < 4096:
        byte = conn.recv(1)
        if not byte:
            return None
        if byte == b"\n":
            parsed = json.loads(line)
            return parsed if isinstance(parsed, dict) else None
        line += byte
    return None


def _close_socket(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


# ---- executor side ----------------------------------------------------------------------------


class ChannelClient:
    """A task's end of the channel. `should_stop` turns true when the driver says stop, or when
    the driver is `lost`: the connection broke, or the lease ran out without a renewal."""

    def __init__(self, address: ChannelAddress, hello: Mapping[str, object]):
        self._sock = socket.create_connection((address.host, address.port), timeout=HELLO_TIMEOUT)
        self._sock.settimeout(SEND_TIMEOUT)
        # No lease until the driver grants one: a task never writes on its own authority.
        self._lease_until = float("-inf")
        self._hold_until = float("-inf")  # a held round's task reads ahead until then
        self._leased = threading.Event()
        self._answered = threading.Event()
        self._stop = threading.Event()
        self._closed = threading.Event()
        self.reason = ""
        self.lost = False  # True: stopping because the driver is gone, not because it said so
        self._send_lock = threading.Lock()
        _send(self._sock, {**hello, "token": address.token})
        self._reader = threading.Thread(target=self._read, name="ktm-channel", daemon=True)
        self._reader.start()
        if not self._answered.wait(HELLO_TIMEOUT):
            self._halt("the driver did not answer", lost=True)

    @property
    def should_stop(self) -> bool:
        if not self._stop.is_set() and time.monotonic() > self._granted_until:
            self._halt("the driver's lease ran out", lost=True)
        return self._stop.is_set()

    @property
    def _granted_until(self) -> float:
        return max(self._lease_until, self._hold_until)

    def wait_writable(self, timeout: float) -> bool:
        """True once a lease was granted (a held task waits for it before its first write);
        False after `timeout` or a stop. Asked before every write: a granted lease costs no lock."""
        return (self._leased.is_set() or self._leased.wait(timeout)) and not self.should_stop

    def report(self, result: TaskResult, final: bool = False) -> None:
        try:
            with self._send_lock:
                _send(self._sock, {"result": encode(result), "final": final})
        except OSError as exc:
            self._halt(f"cannot report to the driver: {exc}", lost=True)

    def close(self) -> None:
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader's recv at once
        except OSError:
            pass
        self._reader.join(timeout=SEND_TIMEOUT + 1)
        self._sock.close()

    def _read(self) -> None:
        try:
            for message in _lines(self._sock, self._closed):
                if "lease" in message:
                    self._lease_until = time.monotonic() + _float(message["lease"])
                    self._hold_until = float("-inf")  # a lease, once granted, alone counts
                    self._leased.set()
                if "hold" in message:
                    self._hold_until = time.monotonic() + _float(message["hold"])
                if message.get("stop"):
                    self._halt("the driver asked to stop")
                self._answered.set()
        except (OSError, ValueError) as exc:
            self._halt(f"lost the driver: {exc}", lost=True)
            return
        finally:
            self._answered.set()
        self._halt("the driver closed the channel", lost=True)

    def _halt(self, reason: str, lost: bool = False) -> None:
        if not self._stop.is_set():
            self.reason, self.lost = reason, lost
            self._stop.set()
            self._leased.set()  # wakes a held task's wait: it must end, not write
