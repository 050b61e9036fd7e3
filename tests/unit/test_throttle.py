"""[limits] shares: the driver splits the group's rates by partitions, the task's throttle keeps
its share (relay.engine.executor.throttle), and fetch sizes shrink so one answer cannot blow
through it. A clock the test moves stands in for time."""

from __future__ import annotations

from relay.config import FetchConfig
from relay.engine.executor.throttle import BURST, Throttle
from tests.support.clock import Clock


def test_without_a_limit_nothing_waits():
    throttle = Throttle(None, None)
    throttle.spend(10**9, 10**12)
    assert not throttle.limited and throttle.wait() == 0


def test_a_read_may_overdraw_and_the_next_waits_until_the_debt_is_paid():
    clock = Clock(100.0)
    throttle = Throttle(1000, None, clock)  # records/s
    assert throttle.wait() == 0  # a burst's worth is there at the start
    throttle.spend(1000 * BURST + 500, 0)
    assert throttle.wait() == 0.5  # 500 records over: half a second at 1000/s
    clock.now += 0.3
    assert round(throttle.wait(), 6) == 0.2
    clock.now += 0.2
    assert throttle.wait() == 0


def test_the_stricter_of_records_and_bytes_sets_the_wait():
    clock = Clock(100.0)
    throttle = Throttle(1000, 10_000, clock)
    throttle.spend(100 + 100, 1_000 + 20_000)  # records: 0.1 s over; bytes: 2 s over
    assert throttle.wait() == 2.0


def test_idle_time_builds_no_more_than_a_burst():
    clock = Clock(100.0)
    throttle = Throttle(1000, None, clock)
    clock.now += 3600
    throttle.spend(1000 * BURST + 1000, 0)  # an hour idle does not make an hour of credit
    assert throttle.wait() == 1.0


def test_fetch_sizes_shrink_to_a_fifth_of_a_second_of_the_limit():
    fetch = FetchConfig()
    assert fetch.within(0, 0) == fetch
    by_bytes = fetch.within(0, 1_000_000)
    assert (by_bytes.max_bytes, by_bytes.partition_max_bytes) == (200_000, 200_000)
    by_records = fetch.within(10_000, 0)  # records taken to be at least 64 bytes
    assert by_records.max_bytes == 10_000 * 0.2 * 64
    assert fetch.within(1, 1).max_bytes == 16 * 1024  # never below one useful fetch
    # never waiting for more than it may bring (Tansu then waits far past max_wait)
    assert fetch.within(1, 1).min_bytes == 16 * 1024
    assert fetch.within(0, 1_000_000).min_bytes == fetch.min_bytes
