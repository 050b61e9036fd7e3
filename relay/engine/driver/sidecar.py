"""Work a long-running job does beside its rounds, on the same Spark (`ktm relay` with
`[verify].follow`: a verifier proving what the relay copies). A sidecar takes some task slots
for itself; the runner plans its rounds over the rest, starts each sidecar on a thread of its
own once Spark is up, and stops it (its event set, joined) when the job ends."""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from relay.engine.driver.seams import Engine

log = logging.getLogger(__name__)

JOIN_TIMEOUT = 10.0


class Sidecar(Protocol):
    slots: int  # task slots it keeps for itself

    def run(self, engine: Engine, stop: threading.Event) -> None:
        """Until `stop` is set; errors it cannot go on after are logged, never raised."""
        ...


class Sidecars:
    def __init__(self, sidecars: tuple[Sidecar, ...]):
        self.sidecars = sidecars
        self.slots = sum(s.slots for s in sidecars)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, engine: Engine) -> None:
        """Once: each sidecar on its thread."""
        if self._threads or not self.sidecars:
            return
        for sidecar in self.sidecars:
            thread = threading.Thread(
                target=self._run,
                args=(sidecar, engine),
                daemon=True,
                name=f"ktm-{type(sidecar).__name__}",
            )
            thread.start()
            self._threads.append(thread)

    def _run(self, sidecar: Sidecar, engine: Engine) -> None:
        try:
            sidecar.run(engine, self._stop)
        except Exception:
            log.exception("%s stopped", type(sidecar).__name__)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT)
