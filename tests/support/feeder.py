"""A feeder: writes numbered records to every partition of a topic, in batches, until stopped,
so a test can start, stop, kill or join ktm processes while records flow."""

from __future__ import annotations

import threading
import time

from testbed.records import Record, produce


class Feeder:
    """Record n has key ``k<n>``, a 100-byte value starting with n, a header ``n``, and goes to
    partition n % partitions. With ``drop_every`` = k, the value of every k-th record starts
    with "drop" instead (for tests/integration/filter_files/drop_marked.py)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        per_batch: int = 60,
        pause: float = 0.05,
        drop_every: int = 0,
    ):
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.per_batch, self.pause, self.drop_every = per_batch, pause, drop_every
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            batch = [
                Record(
                    key=b"k%d" % n,
                    value=(b"drop" if self.drop_every and n % self.drop_every == 0 else b"")
                    + b"%08d" % n
                    + b"." * 92,
                    headers=[("n", b"%d" % n)],
                    partition=n % self.partitions,
                )
                for n in range(self.sent, self.sent + self.per_batch)
            ]
            self.sent += produce(self.bootstrap, self.topic, batch)
            time.sleep(self.pause)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.sent
