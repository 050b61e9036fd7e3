"""A network link on loopback: a TCP proxy that delays every chunk it carries, optionally caps
its bandwidth, and can freeze (hold every byte) for a while.

Relays rarely run on loopback: a round trip between regions is 80-300 ms. `Link` sits between ktm
(or the benchmark's contenders) and a broker the way a long network path does: each chunk read
from one side is written to the other `delay` seconds later (one way; the round trip is twice
that), in order, at most `bandwidth` bytes per second per direction. The broker must advertise
the link's address, so that every connection a client opens after bootstrap crosses it too
(`testbed.tansu.TansuBroker(advertised_port=...)`).

One asyncio loop on a thread of its own carries every connection; a chunk costs a timer, so a
few hundred MB/s pass through on one core.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from pathlib import Path

from testbed.ports import free_port
from testbed.tansu import TansuBroker

CHUNK = 256 * 1024


class Link:
    def __init__(
        self,
        upstream_port: int,
        *,
        delay: float = 0.0,
        bandwidth: float | None = None,
        port: int | None = None,
    ):
        self.upstream_port = upstream_port
        self.delay = delay  # seconds, one way
        self.bandwidth = bandwidth  # bytes per second per direction; None: unbounded
        self.port = port or free_port()
        self.carried = 0  # bytes, both directions
        self._thawed = asyncio.Event()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"link-{self.port}", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Link:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"link on port {self.port} did not start")
        return self

    def set_delay(self, delay: float) -> None:
        """Chunks read from now on take `delay` seconds (one way); in flight ones keep theirs."""
        self.delay = delay

    def freeze(self) -> None:
        """Hold every byte (connections stay open, nothing arrives) until `thaw()`."""
        self._loop.call_soon_threadsafe(self._thawed.clear)

    def thaw(self) -> None:
        self._loop.call_soon_threadsafe(self._thawed.set)

    def stop(self) -> None:
        """Close the listener and every connection; safe twice."""
        if self._loop.is_closed() or not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # ---- the loop's side ------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._thawed.set()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", self.port, reuse_address=True)
        )
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
        pipes = [
            asyncio.ensure_future(self._pipe(client_r, upstream_w)),
            asyncio.ensure_future(self._pipe(upstream_r, client_w)),
        ]
        self._pipes.update(pipes)
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
                self._pipes.discard(pipe)
            for writer in (client_w, upstream_w):
                writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read chunks as they come; write each one `delay` after it was read, in order, no
        faster than the bandwidth allows."""
        queue: deque[tuple[float, bytes]] = deque()
        arrived = asyncio.Event()
        done = False

        async def read() -> None:
            nonlocal done
            with contextlib.suppress(ConnectionError):
                while chunk := await reader.read(CHUNK):
                    queue.append((time.monotonic() + self.delay, chunk))
                    arrived.set()
            done = True
            arrived.set()

        reading = asyncio.ensure_future(read())
        free_at = 0.0  # when the link is free to carry the next chunk (bandwidth)
        try:
            while queue or not done:
                if not queue:
                    arrived.clear()
                    await arrived.wait()
                    continue
                due, chunk = queue.popleft()
                if self.bandwidth:
                    free_at = max(free_at, time.monotonic()) + len(chunk) / self.bandwidth
                    due = max(due, free_at)
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._thawed.wait()
                writer.write(chunk)
                self.carried += len(chunk)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            reading.cancel()


class FarBroker:
    """A Tansu broker reachable only through a `Link`: it advertises the link's address, so
    every client connection (ktm's, the tests' own helpers') crosses the link. Set the delay to
    0 while a test prepares its data, then to the link it wants."""

    supports_kill = True

    def __init__(self, name: str, *, delay: float = 0.0, log_dir: Path | None = None,
                 bandwidth: float | None = None):  # fmt: skip
        inner = free_port()
        self.name = name
        self.link = Link(inner, delay=delay, bandwidth=bandwidth).start()
        self.broker = TansuBroker(name, port=inner, log_dir=log_dir, advertised_port=self.link.port)

    def __repr__(self) -> str:
        rtt = self.link.delay * 2000
        return f"FarBroker({self.name!r}, {self.bootstrap}, {rtt:.0f} ms round trip)"

    @property
    def bootstrap(self) -> str:
        return self.link.address

    def start(self, timeout: float = 10.0) -> FarBroker:
        self.broker.start(timeout)
        return self

    def stop(self, grace: float = 5.0) -> None:
        self.broker.stop(grace)
        self.link.stop()

    def kill(self) -> None:
        self.broker.kill()

    def restart(self, timeout: float = 10.0) -> FarBroker:
        self.broker.restart(timeout)
        return self
