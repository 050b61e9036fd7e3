"""relay.clients.committed: a destination tail is read once its leader committed what it had
appended. The broker's side (a frozen follower holding the high watermark back) is in
tests/integration/test_cluster_faults.py; here its answers are scripted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kafka import TopicPartition

from relay import internals
from relay.clients import committed
from relay.config import ClusterConfig

A, B = TopicPartition("dst", 0), TopicPartition("dst", 1)
CLUSTER = ClusterConfig("target", ("127.0.0.1:9",))


class Leaders:
    """Scripted answers: each poll, the high watermarks and the (epoch, log end) the leaders
    give next; counts the metadata refreshes."""

    def __init__(self, watermarks: list[dict[TopicPartition, int]],
                 ends: list[dict[TopicPartition, tuple[int, int]]]) -> None:  # fmt: skip
        self._watermarks: Iterator[dict[TopicPartition, int]] = iter(watermarks)
        self._ends: Iterator[dict[TopicPartition, tuple[int, int]]] = iter(ends)
        self.refreshes = 0
        self.asked: list[list[TopicPartition]] = []

    def watermark(self, _cluster: object, _consumer: object, parts: list[TopicPartition],
                  _begin: object, _timeout: float) -> dict[TopicPartition, int]:  # fmt: skip
        now = next(self._watermarks)
        return {tp: now[tp] for tp in parts}

    def log_ends(self, _consumer: object, parts: list[TopicPartition], _timeout: float
                 ) -> dict[TopicPartition, tuple[int, int]]:  # fmt: skip
        self.asked.append(list(parts))
        now = next(self._ends)
        return {tp: now[tp] for tp in parts if tp in now}

    def topics(self) -> set[str]:
        self.refreshes += 1
        return {"dst"}


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(committed, "SETTLE_POLL", 0.0)


def script(monkeypatch: pytest.MonkeyPatch, leaders: Leaders) -> None:
    monkeypatch.setattr(committed, "real_end_offsets", leaders.watermark)
    monkeypatch.setattr(
        internals, "log_ends_soon", lambda c, parts, t: lambda: leaders.log_ends(c, parts, t)
    )


def test_a_tail_is_read_once_the_high_watermark_reaches_the_log_end_asked_first(
    monkeypatch: pytest.MonkeyPatch, quick: None
) -> None:
    leaders = Leaders([{A: 15}, {A: 20}], [{A: (3, 20)}, {A: (3, 25)}])
    script(monkeypatch, leaders)
    end = {A: 10, B: 7}
    committed.await_commits(CLUSTER, leaders, {A: (3, 20), B: (3, 7)}, {}, end, 1.0)
    # B was committed; A waited until 20, the end asked before: not for the 25 appended since
    assert end == {A: 20, B: 7}
    assert leaders.asked == [[A], [A]]


def test_a_new_leader_s_log_end_is_what_commits(
    monkeypatch: pytest.MonkeyPatch, quick: None
) -> None:
    # the old leader (epoch 3) held 20; its successor (epoch 4) has 12 of them: 12-19 are gone
    leaders = Leaders([{A: 12}, {A: 12}], [{A: (4, 12)}, {A: (4, 12)}])
    script(monkeypatch, leaders)
    end = {A: 10}
    committed.await_commits(CLUSTER, leaders, {A: (3, 20)}, {}, end, 1.0)
    assert end == {A: 12}


def test_a_leader_that_does_not_answer_makes_the_metadata_read_again(
    monkeypatch: pytest.MonkeyPatch, quick: None
) -> None:
    leaders = Leaders([{A: 10}, {A: 20}], [{}, {A: (3, 20)}])
    script(monkeypatch, leaders)
    end = {A: 10}
    committed.await_commits(CLUSTER, leaders, {A: (3, 20)}, {}, end, 1.0)
    assert (end, leaders.refreshes) == ({A: 20}, 1)


def test_a_stall_past_the_limit_is_said_and_the_tail_read_as_it_stands(
    monkeypatch: pytest.MonkeyPatch, quick: None, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(committed, "SETTLE_LIMIT", 0.0)
    leaders = Leaders([{A: 10}] * 3, [{A: (3, 20)}] * 3)
    script(monkeypatch, leaders)
    end = {A: 10}
    committed.await_commits(CLUSTER, leaders, {A: (3, 20)}, {}, end, 1.0)
    assert end == {A: 10}
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "destination dst[0]" in line and "may arrive twice" in line


def test_nothing_appended_past_the_high_watermark_asks_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    leaders = Leaders([], [])
    script(monkeypatch, leaders)
    end = {A: 10}
    committed.await_commits(CLUSTER, leaders, {A: (3, 10)}, {}, end, 1.0)
    committed.await_commits(CLUSTER, leaders, {}, {}, end, 1.0)  # Tansu: no log ends
    assert (end, leaders.asked) == ({A: 10}, [])


def test_the_wait_is_the_limit_asked_once_something_waits(
    monkeypatch: pytest.MonkeyPatch, quick: None, caplog: pytest.LogCaptureFixture
) -> None:
    asked: list[int] = []

    def limit() -> float:
        asked.append(1)
        return 0.0

    leaders = Leaders([{A: 10}] * 3, [{A: (3, 20)}] * 3)
    script(monkeypatch, leaders)
    end = {A: 10}
    committed.await_commits(CLUSTER, leaders, {A: (3, 10)}, {}, end, 1.0, limit)
    assert asked == []  # nothing waits: the broker is not asked
    committed.await_commits(CLUSTER, leaders, {A: (3, 20)}, {}, end, 1.0, limit)
    assert (end, asked) == ({A: 10}, [1])
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "after 0 s" in line


@pytest.mark.parametrize(
    ("described", "limit"),
    [("60000", 75.0), ("30000", 45.0), ("500", 15.5), (None, 45.0), ("", 45.0),
     ("soon", 45.0), ("0", 45.0), ("-1", 45.0)],
)  # fmt: skip
def test_the_limit_is_the_brokers_lag_limit_and_a_margin(
    described: str | None, limit: float
) -> None:
    assert committed.settle_limit(described) == limit
