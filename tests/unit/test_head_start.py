"""Clients opened ahead on threads of their own, then taken into the caller's kept clients
(relay.clients.kept.HeadStart)."""

from __future__ import annotations

import threading

from relay.clients.kept import Ahead, HeadStart, keep_clients, kept


class Client:
    def __init__(self, name: str):
        self.name, self.closed = name, False

    def close(self) -> None:
        self.closed = True


def test_clients_opened_ahead_are_the_ones_kept_hands_out():
    ahead = Client("ahead")
    head = HeadStart([Ahead("probe", lambda: ahead, Client.close)])
    with keep_clients():
        head.take(5.0)
        with kept("probe", lambda: Client("made here"), Client.close) as client:
            assert client is ahead
        assert not ahead.closed
    assert ahead.closed  # with the cache it was taken into


def test_one_that_fails_to_open_is_left_to_the_caller():
    def refused() -> Client:
        raise ConnectionError("no answer")

    head = HeadStart([Ahead("probe", refused, Client.close)])
    with keep_clients():
        head.take(5.0)
        with kept("probe", lambda: Client("made here"), Client.close) as client:
            assert client.name == "made here"


def test_what_is_not_taken_is_closed_and_what_opens_too_late_too():
    opened, release = Client("opened"), threading.Event()
    late = Client("late")

    def slow() -> Client:
        release.wait(5.0)
        return late

    head = HeadStart([Ahead("a", lambda: opened, Client.close), Ahead("b", slow, Client.close)])
    head.take(0.05)  # "b" still opening; no cache on this thread: "a" is closed
    assert opened.closed and not late.closed
    release.set()
    head._threads[1].join(5.0)
    assert late.closed  # it came after the take


def test_a_client_the_cache_holds_already_wins():
    ahead = Client("ahead")
    head = HeadStart([Ahead("probe", lambda: ahead, Client.close)])
    with keep_clients():
        with kept("probe", lambda: Client("first"), Client.close) as first:
            pass
        head.take(5.0)
        with kept("probe", lambda: Client("again"), Client.close) as client:
            assert client is first
        assert ahead.closed
