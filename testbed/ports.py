"""Ports on 127.0.0.1 for the servers the testbed starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on right now (a tiny race with other programs remains)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    """True when ``port`` can be bound on 127.0.0.1 at this moment."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
