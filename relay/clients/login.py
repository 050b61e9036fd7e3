"""Why a cluster refused ktm: the TLS handshake, the SASL mechanism, or the credentials.

kafka-python 3.0 only times out when it cannot bootstrap: it logs the cause (at a level ktm
silences: its DEBUG logs carry passwords) and tries again until its deadline. A refused login
is not worth retrying - a wrong password does not become right - and its reason is what the
operator needs. So before its first client of a cluster (and again after a bootstrap timeout)
ktm logs in by hand, over one socket to the first server: the TLS handshake, an ApiVersions
request (under TLS 1.3 a broker that wants a client certificate refuses it only then), the
SaslHandshake, and the SASL exchange itself (PLAIN, or SCRAM per RFC 5802). A refusal is a
ConfigError naming the config key at fault (exit 2); no answer is left to the caller, which
reports a connection failure.

Hand-made and not kafka-python's: its connections lose the broker's answer to a failed login
about half the time (Apache Kafka 4.4 closes the connection just after the answer, and
kafka-python reports "socket disconnected"), measured on the test cluster's SCRAM listener.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import socket
import ssl
import struct
import time

from relay.clients.settings import describe
from relay.config import ClusterConfig
from relay.errors import ConfigError

_API_VERSIONS, _SASL_HANDSHAKE, _SASL_AUTHENTICATE = 18, 17, 36
_UNSUPPORTED_SASL_MECHANISM = 33
_CLIENT_ID = b"ktm"


class _Refused(Exception):
    """The broker answered a step with an error: (error code, its message)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


_LOGGED_IN: set[ClusterConfig] = set()  # the clusters this process logged in to once


def check_login(cluster: ClusterConfig, timeout: float) -> None:
    """Before the first client of a cluster with TLS or SASL: one hand-made login, so that a
    refused one is reported at once, not after kafka-python's bootstrap timeout (10 s and more
    at start-up). Raises the ConfigError, or ConnectionError when no server takes a connection
    (kafka-python could not bootstrap either: not waiting for it twice)."""
    if cluster in _LOGGED_IN or not (cluster.tls or cluster.sasl_mechanism):
        return
    outcome = _login(cluster, timeout)
    if isinstance(outcome, ConfigError):
        raise outcome
    if outcome is False:
        raise ConnectionError(f"no broker answered within {timeout:g}s")
    if outcome:
        _LOGGED_IN.add(cluster)


def login_problem(cluster: ClusterConfig, timeout: float) -> ConfigError | None:
    """One login as kafka-python makes it: what the operator must fix, or None (no server
    answered, or one let ktm in: the problem is elsewhere)."""
    outcome = _login(cluster, timeout)
    return outcome if isinstance(outcome, ConfigError) else None


def _login(cluster: ClusterConfig, timeout: float) -> ConfigError | bool | None:
    """Each server in turn until one gives a verdict: the problem, or True (logged in).
    False: no server took a connection; None: one did, without a verdict (it closed the
    connection, or spoke no Kafka ktm knows): left to kafka-python."""
    deadline = time.monotonic() + timeout
    outcome: ConfigError | bool | None = False
    for server in cluster.servers:
        host, _, port = server.rpartition(":")
        try:
            raw = socket.create_connection((host, int(port)), max(deadline - time.monotonic(), 0.1))
        except (OSError, ValueError):
            continue
        with raw:
            outcome = _login_on(cluster, raw, host, port)
        if outcome is not None:
            return outcome
    return outcome


def _login_on(
    cluster: ClusterConfig, raw: socket.socket, host: str, port: str
) -> ConfigError | bool | None:
    try:
        exchange = _Exchange(_tls(cluster, raw, host) if cluster.tls else raw)
        exchange.api_versions()
        if cluster.sasl_mechanism:
            _sasl(cluster, exchange)
    except ConfigError as problem:
        return problem
    except ssl.SSLError as exc:
        return _tls_refused(cluster, exc, host, port)
    except (OSError, ValueError, KeyError, struct.error):
        return None  # not Kafka's answers as this module knows them
    return True


def _tls(cluster: ClusterConfig, raw: socket.socket, host: str) -> ssl.SSLSocket:
    try:
        context = ssl.create_default_context(cafile=cluster.ca_cert_path)
    except (OSError, ssl.SSLError) as exc:
        raise _problem(
            cluster, "ca_cert_path", f"cannot be read as PEM certificates ({exc})"
        ) from exc
    if cluster.client_cert_path:
        try:
            context.load_cert_chain(cluster.client_cert_path, cluster.client_key_path)
        except (OSError, ssl.SSLError) as exc:
            raise _problem(
                cluster, "client_cert_path", f"cannot be loaded with its key ({exc})"
            ) from exc
    sock = context.wrap_socket(raw, server_hostname=host)
    sock.do_handshake()
    return sock


def _tls_refused(cluster: ClusterConfig, exc: ssl.SSLError, host: str, port: str) -> ConfigError:
    """Our verification of the broker failed (the CA), or the broker refused our certificate
    (sent none, or one it does not trust)."""
    reason = str(exc.reason or exc)
    if "WRONG_VERSION" in reason or "UNEXPECTED_EOF" in reason:
        key = "tls"  # the listener does not speak TLS
    else:
        key = "ca_cert_path" if "VERIFY_FAILED" in reason else "client_cert_path"
    return _problem(cluster, key, f"TLS handshake with {host}:{port} failed: {reason}")


def _problem(cluster: ClusterConfig, key: str, message: str) -> ConfigError:
    side = "source " if cluster.section.startswith("[[sources]]") else ""
    return ConfigError(f"{side}{describe(cluster)}: {cluster.key(key)}: {message}")


def _sasl(cluster: ClusterConfig, exchange: _Exchange) -> None:
    mechanism = cluster.sasl_mechanism or ""
    code, enabled = exchange.sasl_handshake(mechanism)
    if code == _UNSUPPORTED_SASL_MECHANISM or mechanism not in enabled:
        listed = ", ".join(enabled) or "none"
        disabled = f"{mechanism} is not enabled on this listener (it enables {listed})"
        raise _problem(cluster, "sasl_mechanism", disabled)
    if code:
        raise _problem(cluster, "sasl_mechanism", f"the broker refused SASL (error code {code})")
    username = cluster.username or ""
    password = cluster.password.value if cluster.password else ""
    try:
        if mechanism == "PLAIN":
            exchange.sasl_authenticate(b"\0" + username.encode() + b"\0" + password.encode())
        else:
            _scram(exchange, mechanism, username, password)
    except _Refused as exc:
        refused = f"the broker refused the login of user {username!r} ({mechanism}): {exc}"
        raise _problem(cluster, "password", refused) from exc


def _scram(exchange: _Exchange, mechanism: str, username: str, password: str) -> None:
    """RFC 5802, as Apache Kafka's ScramSaslServer takes it (no channel binding)."""
    digest = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
    name = username.replace("=", "=3D").replace(",", "=2C")
    nonce = secrets.token_urlsafe(18)
    bare = f"n={name},r={nonce}"
    server_first = exchange.sasl_authenticate(f"n,,{bare}".encode()).decode()
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    if not fields.get("r", "").startswith(nonce):
        raise ValueError("SCRAM: the server's nonce does not extend ours")
    salted = hashlib.pbkdf2_hmac(
        digest, password.encode(), base64.b64decode(fields["s"]), int(fields["i"])
    )
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    without_proof = f"c=biws,r={fields['r']}"
    message = f"{bare},{server_first},{without_proof}".encode()
    signature = hmac.new(hashlib.new(digest, client_key).digest(), message, digest).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True)))
    exchange.sasl_authenticate(f"{without_proof},p={proof.decode()}".encode())


class _Exchange:
    """Kafka requests over one blocking socket: the few this module needs, in versions every
    Apache Kafka since 2.2 answers (request header v1, response header v0)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.correlation = 0

    def api_versions(self) -> None:
        self._call(_API_VERSIONS, 0, b"")

    def sasl_handshake(self, mechanism: str) -> tuple[int, list[str]]:
        """The error code, and the mechanisms the listener enables."""
        body = _Reader(self._call(_SASL_HANDSHAKE, 1, _string(mechanism)))
        code = body.int16()
        return code, [body.string() or "" for _ in range(body.int32())]

    def sasl_authenticate(self, token: bytes) -> bytes:
        body = _Reader(self._call(_SASL_AUTHENTICATE, 1, struct.pack(">i", len(token)) + token))
        code, message, answer = body.int16(), body.string(), body.bytes_()
        if code:
            raise _Refused(code, message or f"error code {code}")
        return answer

    def _call(self, api: int, version: int, body: bytes) -> bytes:
        self.correlation += 1
        header = struct.pack(">hhi", api, version, self.correlation) + _string(_CLIENT_ID)
        request = header + body
        self.sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", self._read(4))
        answer = self._read(size)
        return answer[4:]  # the correlation id

    def _read(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            data += chunk
        return data


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def _take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def int16(self) -> int:
        return self._take(">h")

    def int32(self) -> int:
        return self._take(">i")

    def string(self) -> str | None:
        size = self.int16()
        if size < 0:
            return None
        self.at += size
        return self.data[self.at - size : self.at].decode()

    def bytes_(self) -> bytes:
        size = self.int32()
        self.at += max(size, 0)
        return self.data[self.at - max(size, 0) : self.at]


def _string(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack(">h", len(raw)) + raw
