"""A consumer group member run by Apache Kafka's own Java client (testbed/java/GroupMember.java),
for what kafka-python cannot do: join a group with KIP-848's consumer protocol
(`group.protocol=consumer`). The broker's jars (testbed.kafka.kafka_lib) hold the client; the
JDK's source launcher runs the one file, so nothing is built or fetched.

    with GroupMember(bootstrap, "orders-readers", "orders") as member:
        ...  # a member of the group, assigned partitions of the topic; it leaves on exit

Like the rest of testbed/, nothing here uses the code under test.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO

from testbed.kafka import VERSIONS, kafka_lib

SOURCE = Path(__file__).parent / "java" / "GroupMember.java"
START_TIMEOUT = 90.0  # seconds: compiling the file and joining, on two busy cores
STOP_TIMEOUT = 30.0


class GroupMember:
    """One member of `group`, subscribed to `topic` with `protocol` ("consumer": KIP-848, or
    "classic"); it reads and, with `commit`, commits what it read after each poll."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topic: str,
        *,
        protocol: str = "consumer",
        commit: bool = False,
        version: str = VERSIONS["4"],
    ):
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.protocol, self.commit, self.version = protocol, commit, version
        self.lines: list[str] = []  # what it printed ("assigned ...", "left")
        self._errors: list[str] = []
        self._proc: subprocess.Popen[str] | None = None

    def __repr__(self) -> str:
        return f"GroupMember({self.group!r} on {self.topic!r}, {self.protocol})"

    def start(self, timeout: float = START_TIMEOUT) -> GroupMember:
        """Start it; returns once it is assigned at least one partition."""
        mode = "commit" if self.commit else "read"
        command = ["java", "-cp", f"{kafka_lib(self.version)}/*", str(SOURCE), self.bootstrap,
                   self.group, self.topic, self.protocol, mode]  # fmt: skip
        self._proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip
        for stream, into in ((self._proc.stdout, self.lines), (self._proc.stderr, self._errors)):
            threading.Thread(target=_drain, args=(stream, into), daemon=True).start()
        self._wait(lambda: any(_assigned(line) for line in self.lines), timeout, "assigned")
        return self

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Leave the group (it closes its consumer when its stdin closes), or be killed."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"{self!r} did not leave within {timeout:g}s") from None

    @property
    def left(self) -> bool:
        return "left" in self.lines

    def _wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            proc = self._proc
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"{self!r} exited ({proc.returncode}): {self._tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"{self!r} not {what} within {timeout:g}s: {self._tail()}")
            time.sleep(0.1)

    def _tail(self) -> str:
        return " | ".join((self.lines + self._errors)[-12:])

    def __enter__(self) -> GroupMember:
        return self.start() if self._proc is None else self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _assigned(line: str) -> bool:
    """A line saying it holds partitions (its first assignment may be empty)."""
    return line.startswith("assigned ") and bool(line.removeprefix("assigned ").strip())


def _drain(stream: IO[str], into: list[str]) -> None:
    for line in stream:
        into.append(line.rstrip("\n"))
