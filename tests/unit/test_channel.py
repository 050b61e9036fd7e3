"""The control channel on loopback: token, live reports, stop, lease, a lost driver."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

import pytest

from relay.engine.channel import ChannelClient, ControlServer, Report
from relay.spec import ChannelAddress, FetchTrouble, PartitionProgress, TaskError, TaskResult


def wait(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def server():
    reports: list[Report] = []
    leases = {"lease": 2.0}
    srv = ControlServer("127.0.0.1", 0, "s3cret-token", lambda _: leases["lease"], reports.append)
    srv.reports = reports
    srv.leases = leases
    yield srv
    srv.close()


def hello(round_id: int = 1, task: int = 0) -> dict:
    return {"round": round_id, "task": task, "attempt": 0, "pid": 1}


def result(round_id: int = 1, **kw) -> TaskResult:
    part = PartitionProgress(("t", 0), next_offset=42, produced=40, filtered=(("f", 2),))
    return TaskResult(round_id, 0, 0, (part,), **kw)


def test_reports_reach_the_driver_intact(server) -> None:
    client = ChannelClient(server.address, hello())
    error = TaskError("target", "boom", True, ("t", 0))
    trouble = (FetchTrouble("10.0.0.1:9092", 3, "RequestTimedOutError: late", 4.5),)
    client.report(result(error=error, latencies=(0.5,), trouble=trouble, throttled=1.5), final=True)
    wait(lambda: server.reports)
    report = server.reports[0]
    assert (report.round_id, report.task_id, report.attempt, report.final) == (1, 0, 0, True)
    assert report.result == result(error=error, latencies=(0.5,), trouble=trouble, throttled=1.5)
    assert server.connected(1) == 1
    client.close()
    wait(lambda: server.connected(1) == 0)


def test_stop_reaches_every_task_of_the_round_at_once(server) -> None:
    clients = [ChannelClient(server.address, hello(task=i)) for i in range(3)]
    other = ChannelClient(server.address, hello(round_id=2))
    wait(lambda: server.connected(1) == 3)
    asked = time.monotonic()
    server.stop_round(1)
    wait(lambda: all(c.should_stop for c in clients), timeout=1.0)
    assert time.monotonic() - asked < 0.5
    assert not other.should_stop
    assert not clients[0].lost and clients[0].reason == "the driver asked to stop"
    # a task of a stopped round that connects late hears it at once
    late = ChannelClient(server.address, hello(task=9))
    wait(lambda: late.should_stop, timeout=1.0)
    for c in [*clients, other, late]:
        c.close()


def test_a_connection_without_the_token_is_refused(server) -> None:
    address = ChannelAddress(server.address.host, server.address.port, "wrong")
    client = ChannelClient(address, hello())
    client.report(result())
    wait(lambda: client.should_stop)
    assert client.lost and server.reports == []
    client.close()


def test_garbage_is_dropped_without_harm(server) -> None:
    with socket.create_connection((server.address.host, server.address.port)) as raw:
        raw.sendall(b"\xff\xfe not json\n")
        raw.settimeout(2)
        assert raw.recv(100) == b""  # closed
    good = ChannelClient(server.address, hello())
    good.report(result())
    wait(lambda: server.reports)
    good.close()


def test_without_renewals_the_lease_runs_out(server) -> None:
    server.leases["lease"] = 0.3
    client = ChannelClient(server.address, hello())
    assert not client.should_stop
    server.leases["lease"] = None  # the driver lost its right to write (e.g. group membership)
    client.report(result())
    time.sleep(0.5)
    assert client.should_stop and client.lost and "lease" in client.reason
    client.close()


def test_a_task_never_writes_without_a_first_lease(server) -> None:
    server.leases["lease"] = None
    client = ChannelClient(server.address, hello())
    assert client.should_stop and client.lost
    client.close()


def test_a_held_task_reads_on_writes_nothing_and_writes_once_its_lease_is_pushed(server) -> None:
    """A held round's task (planned before the group's first assignment) hears a hold, not a
    lease: it keeps running but may not write; the lease the driver then grants reaches it at
    once (`renew`), not at the next renewal."""
    server.leases["lease"], server.hold_for = None, lambda _: 2.0
    client = ChannelClient(server.address, hello())
    assert not client.should_stop
    assert not client.wait_writable(0.2)
    wait(lambda: server.connected(1) == 1)
    server.leases["lease"] = 2.0
    began = time.monotonic()
    server.renew(1)
    assert client.wait_writable(1.0) and time.monotonic() - began < 0.2
    assert not client.should_stop
    client.close()


def test_a_hold_not_renewed_runs_out_and_a_stopped_held_task_never_may_write(server) -> None:
    server.leases["lease"], server.hold_for = None, lambda _: 0.3
    client = ChannelClient(server.address, hello())
    server.hold_for = lambda _: None  # the driver no longer answers for the round
    client.report(result())
    time.sleep(0.5)
    assert client.should_stop and client.lost
    assert not client.wait_writable(0.1)
    client.close()

    server.hold_for = lambda _: 2.0
    held = ChannelClient(server.address, hello(round_id=2))
    server.stop_round(2)  # planned again instead: what it read is dropped
    wait(lambda: held.should_stop)
    assert not held.wait_writable(0.1) and not held.lost
    held.close()


def test_renewals_keep_a_reporting_task_running(server) -> None:
    server.leases["lease"] = 0.3
    client = ChannelClient(server.address, hello())
    for _ in range(8):  # 0.8 s, well past one lease, renewed by every answer
        client.report(result())
        time.sleep(0.1)
    assert not client.should_stop
    client.close()


def test_a_driver_that_goes_away_stops_the_task() -> None:
    srv = ControlServer("127.0.0.1", 0, "tok", lambda _: 30.0, lambda r: None)
    client = ChannelClient(srv.address, hello())
    wait(lambda: srv.connected(1) == 1)
    srv.close()
    wait(lambda: client.should_stop, timeout=5.0)
    assert client.lost
    client.close()


def test_closing_the_driver_side_does_not_wait_for_its_accept_loop() -> None:
    srv = ControlServer("127.0.0.1", 0, "tok", lambda _: 30.0, lambda r: None)
    time.sleep(0.1)  # the accept loop waits in accept(), which gives up every 0.5 s
    began = time.monotonic()
    srv.close()
    assert time.monotonic() - began < 0.4  # every run ends a stop with this close
    with pytest.raises(OSError):
        socket.create_connection((srv.address.host, srv.address.port), timeout=1).close()


def test_messages_are_json_lines_without_secrets(server) -> None:
    """What travels: offsets and counts, never configuration (the token only in the hello)."""
    sent: list[bytes] = []
    with socket.create_connection((server.address.host, server.address.port)) as raw:
        line = json.dumps({**hello(), "token": "s3cret-token"}).encode() + b"\n"
        raw.sendall(line)
        raw.settimeout(2)
        sent.append(raw.recv(1000))
    answer = json.loads(sent[0].splitlines()[0])
    assert answer == {"stop": False, "lease": 2.0}
