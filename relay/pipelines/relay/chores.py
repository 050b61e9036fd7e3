"""A chore the relay driver does every so often beside relaying (topic ACLs, topic configs): on
its own daemon thread, first when started, then every `interval`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

CLOSE_WAIT = 2.0  # seconds: a chore busy with a cluster that does not answer ends by itself


class Periodic:
    def __init__(self, name: str, interval: float, work: Callable[[], None]):
        self.name, self.interval, self._work = name, interval, work
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"ktm-{name}", daemon=True)

    def start(self) -> None:
        """Once (later calls do nothing), and never after close()."""
        if self._thread.ident is None and not self._stop.is_set():
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=CLOSE_WAIT)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._work()
            except Exception as exc:  # noqa: BLE001 - the next interval tries again
                log.warning("%s failed (next try in %gs): %s", self.name, self.interval, exc)
            self._stop.wait(self.interval)
