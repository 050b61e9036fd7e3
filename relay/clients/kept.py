"""Clients kept open through a run of questions to the same clusters.

Start-up asks each cluster several things one after another (partition counts, the
destination's tails, committed offsets, end offsets, topic configs), each through a client of
its own: a bootstrap (connect, API versions, metadata) costs three or four round trips, a second
or more across a 240 ms link; and a health check every few seconds paid it every time. Inside
`keep_clients()` (or a `ClientCache`'s `use()`), the clients `kept()` makes are reused per
(kind, cluster, settings) and closed when the cache closes. kafka-python's clients are not
thread-safe: a cache is used by one thread at a time (the thread's own, or one a caller guards
with a lock); a client whose use raised is dropped (its connection may be broken) and the next
use makes a new one.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar, cast

T = TypeVar("T")

log = logging.getLogger(__name__)

_local = threading.local()


class ClientCache:
    def __init__(self) -> None:
        # by key: a client, and how to close it
        self.clients: dict[Hashable, tuple[object, Callable[[], object]]] = {}

    @contextmanager
    def use(self) -> Iterator[None]:
        """`kept()` on this thread takes its clients from this cache until the block ends."""
        before = getattr(_local, "cache", None)
        _local.cache = self
        try:
            yield
        finally:
            _local.cache = before

    def close(self) -> None:
        clients, self.clients = self.clients, {}
        for _, close in clients.values():
            _close_quietly(close)


@contextmanager
def keep_clients() -> Iterator[None]:
    """Reuse clients on this thread until the block ends (nested blocks share the outer one)."""
    if getattr(_local, "cache", None) is not None:
        yield
        return
    cache = ClientCache()
    try:
        with cache.use():
            yield
    finally:
        cache.close()


@contextmanager
def kept(key: Hashable, make: Callable[[], T], close: Callable[[T], object]) -> Iterator[T]:
    """A client for `key`: the cached one while a cache is in use, else a new one closed
    after."""
    cache: ClientCache | None = getattr(_local, "cache", None)
    if cache is None:
        client = make()
        try:
            yield client
        finally:
            close(client)
        return
    if key not in cache.clients:
        made = make()
        cache.clients[key] = (made, functools.partial(close, made))
    # what is cached under a key was made by a `make` of that key's kind: a T
    client = cast(T, cache.clients[key][0])
    try:
        yield client
    except BaseException:
        cache.clients.pop(key, None)
        _close_quietly(functools.partial(close, client))
        raise


class Ahead(NamedTuple):
    """A client to open ahead: the key `kept()` will ask for, and how to make and close it."""

    key: Hashable
    make: Callable[[], Any]
    close: Callable[[Any], object]


class HeadStart:
    """Clients opened on threads of their own while the caller's thread asks other things,
    then handed to that thread's cache (`take`), where `kept()` finds them open. One that
    fails to open is left for the caller, who opens its own and meets the error there."""

    def __init__(self, aheads: Sequence[Ahead]):
        self._made: dict[Hashable, tuple[object, Callable[[], object]]] = {}
        self._over = False  # taken or closed: what opens later is closed at once
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._open, args=(a,), name="ktm-head-start", daemon=True)
            for a in aheads
        ]
        for thread in self._threads:
            thread.start()

    def _open(self, ahead: Ahead) -> None:
        try:
            client = ahead.make()
        except Exception as exc:  # noqa: BLE001 - the caller opens its own
            log.debug("opening %s ahead: %s", ahead.key, exc)
            return
        with self._lock:
            if not self._over:
                self._made[ahead.key] = (client, functools.partial(ahead.close, client))
                return
        _close_quietly(functools.partial(ahead.close, client))

    def take(self, timeout: float) -> None:
        """Into this thread's cache what was opened, after waiting up to `timeout` for what
        is still opening (a client the cache holds already, or with no cache: closed)."""
        for thread in self._threads:
            thread.join(timeout)
        cache: ClientCache | None = getattr(_local, "cache", None)
        for key, (client, close) in self._end().items():
            if cache is not None and key not in cache.clients:
                cache.clients[key] = (client, close)
            else:
                _close_quietly(close)

    def close(self) -> None:
        """What was opened and not taken, closed."""
        for _, close in self._end().values():
            _close_quietly(close)

    def _end(self) -> dict[Hashable, tuple[object, Callable[[], object]]]:
        """What was opened so far; what opens from now on is closed at once."""
        with self._lock:
            self._over = True
            made, self._made = self._made, {}
        return made


def _close_quietly(close: Callable[[], object]) -> None:
    try:
        close()
    except Exception:  # noqa: BLE001 - a client being thrown away
        pass
