"""Clients kept through a run of questions (relay.clients.kept): one opened early on a thread
of its own is the one handed out; one that failed to open early is made again where it is asked
for; one never asked for is closed with the cache."""

from __future__ import annotations

import threading

from relay.clients.kept import keep_clients, kept, open_early


class Client:
    made: list[Client] = []  # every one, in order (each test empties it first)

    def __init__(self, name: str):
        self.name, self.closed, self.thread = name, False, threading.current_thread().name
        Client.made.append(self)

    def close(self) -> None:
        self.closed = True


def test_a_client_opened_early_is_the_one_handed_out_and_it_opened_elsewhere() -> None:
    made: list[Client] = []

    def make() -> Client:
        made.append(Client("early"))
        return made[-1]

    with keep_clients():
        open_early("k", make, Client.close)
        with kept("k", make, Client.close) as client:
            assert client is made[0] and len(made) == 1
            assert client.thread != threading.current_thread().name
    assert made[0].closed


def test_a_client_that_failed_to_open_early_is_made_again_when_asked_for() -> None:
    calls: list[str] = []

    def make() -> Client:
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            raise OSError("not yet")
        return Client("again")

    with keep_clients():
        open_early("k", make, Client.close)
        with kept("k", make, Client.close) as client:
            assert client.name == "again" and calls[1] == threading.current_thread().name


def test_a_client_opened_early_and_never_asked_for_is_closed_with_the_cache() -> None:
    made = Client.made
    made.clear()
    with keep_clients():
        open_early("k", lambda: Client("unused"), Client.close)
    for _ in range(100):  # closed once its opening thread is done
        if made and made[0].closed:
            break
        threading.Event().wait(0.01)
    assert made and made[0].closed


def test_outside_a_cache_nothing_is_opened_early() -> None:
    Client.made.clear()
    open_early("k", lambda: Client("x"), Client.close)
    assert Client.made == []
