"""Authentication and TLS: config keys -> kafka-python settings, their validation, and secrets.

No broker: every SASL mechanism x TLS variant is checked on the settings ktm hands kafka-python
(`client_settings`, `producer_settings`), against the keys kafka-python's constructors accept and
against kafka-python's own SASL mechanisms and SSL context builder. A `ktm relay --debug` run that
cannot connect shows that the password stays out of every log line and error.
"""

from __future__ import annotations

import json
import logging
import signal
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.net.sasl import get_sasl_mechanism
from kafka.net.transport import KafkaSSLTransport

from relay.cli import main
from relay.clients.admin import client_settings
from relay.clients.producer import producer_settings
from relay.config import SASL_MECHANISMS, Config, Secret, load_config
from relay.errors import ConfigError
from testbed.ports import free_port

PASSWORD = "s3cr3t-Pa55word-never-shown"
USERNAME = "relay-user"
ENV_VAR = "KTM_TEST_PW"

MECHANISMS = (None, *SASL_MECHANISMS)
TLS_MODES = ("off", "ca", "mutual")
PROTOCOL = {
    (False, False): "PLAINTEXT",
    (False, True): "SSL",
    (True, False): "SASL_PLAINTEXT",
    (True, True): "SASL_SSL",
}
SASL_KEYS = ("sasl_mechanism", "sasl_plain_username", "sasl_plain_password")
SSL_KEYS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")
CERT_NAMES = {"ca": "ca.pem", "cert": "client.pem", "key": "client.key"}


# --- config files --------------------------------------------------------------------------------


def cert_files(directory: Path) -> dict[str, Path]:
    """Files for the cert keys; load_config only checks that they exist."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / file for name, file in CERT_NAMES.items()}
    for path in paths.values():
        path.write_text("not checked by load_config\n")
    return paths


def auth_lines(
    mechanism: str | None,
    tls: str,
    certs: dict[str, Path],
    *,
    password: str = PASSWORD,
) -> str:
    """The connection keys for one SASL mechanism x TLS variant, as TOML lines."""
    lines = []
    if mechanism is not None:
        lines += [
            f'sasl_mechanism = "{mechanism}"',
            f'username = "{USERNAME}"',
            f'password = "{password}"',
        ]
    if tls != "off":
        lines += ["tls = true", f'ca_cert_path = "{certs["ca"]}"']
    if tls == "mutual":
        lines += [f'client_cert_path = "{certs["cert"]}"', f'client_key_path = "{certs["key"]}"']
    return "\n".join(lines)


def config_text(source_lines: str = "", target_lines: str = "", extra: str = "") -> str:
    return (
        '[app]\nmetrics_addr = ""\n\n[topics]\n"demo" = "demo-copy"\n\n'
        f'[[sources]]\nname = "dc1"\nservers = ["127.0.0.1:19092"]\n{source_lines}\n\n'
        f'[target]\nservers = ["127.0.0.1:19093"]\n{target_lines}\n\n{extra}\n'
    )


def load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_config(path)


def load_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    message = str(caught.value)
    assert "\n" not in message, message
    assert PASSWORD not in message, message
    return message


# --- every mechanism x TLS variant -> kafka-python settings ---------------------------------------


def expected_settings(
    mechanism: str | None, tls: str, certs: dict[str, Path], password: str = PASSWORD
) -> dict[str, Any]:
    expected: dict[str, Any] = {
        "security_protocol": PROTOCOL[(mechanism is not None, tls != "off")],
    }
    if mechanism is not None:
        expected |= {
            "sasl_mechanism": mechanism,
            "sasl_plain_username": USERNAME,
            "sasl_plain_password": password,  # the plain string: kafka-python sends it
        }
    if tls != "off":
        mutual = tls == "mutual"
        expected |= {
            "ssl_cafile": str(certs["ca"]),
            "ssl_certfile": str(certs["cert"]) if mutual else None,
            "ssl_keyfile": str(certs["key"]) if mutual else None,
        }
    return expected


def assert_auth_settings(settings: dict[str, Any], expected: dict[str, Any]) -> None:
    assert {key: settings.get(key) for key in expected} == expected
    # Keys of a feature that is off are absent or None: kafka-python's defaults then apply.
    for key in (*SASL_KEYS, *SSL_KEYS):
        if key not in expected:
            assert settings.get(key) is None, key


def assert_known_to(settings: dict[str, Any], *client_classes: type) -> None:
    """Every key is one the constructor accepts (they raise on unknown keys, after connecting)."""
    for cls in client_classes:
        unknown = set(settings) - set(cls.DEFAULT_CONFIG)  # type: ignore[attr-defined]
        assert not unknown, f"{cls.__name__} does not accept {sorted(unknown)}"


@pytest.mark.parametrize("tls", TLS_MODES)
@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m or "no-sasl")
def test_auth_and_tls_keys_map_onto_kafka_python_settings(
    tmp_path: Path, mechanism: str | None, tls: str
) -> None:
    certs = cert_files(tmp_path / "certs")
    lines = auth_lines(mechanism, tls, certs)
    cfg = load(tmp_path, config_text(lines, lines))
    expected = expected_settings(mechanism, tls, certs)

    source = client_settings(cfg.sources[0])
    target = client_settings(cfg.need_target().cluster)
    producer = producer_settings(cfg.need_target())

    for settings in (source, target, producer):
        assert_auth_settings(settings, expected)
    assert source["bootstrap_servers"] == ["127.0.0.1:19092"]
    assert producer["bootstrap_servers"] == ["127.0.0.1:19093"]
    # client_settings feeds the admin client and both consumers; producer_settings the producer.
    assert_known_to(source, KafkaAdminClient, KafkaConsumer, KafkaProducer)
    assert_known_to(producer, KafkaProducer)
    # The typed config keeps the password wrapped; only the settings for kafka-python unwrap it.
    if mechanism is not None:
        assert cfg.need_target().cluster.password == Secret(PASSWORD)


@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
def test_kafka_pythons_sasl_mechanisms_accept_the_settings(tmp_path: Path, mechanism: str) -> None:
    """The mechanism name is one kafka-python knows, and it finds the credentials it needs."""
    lines = auth_lines(mechanism, "off", {})
    settings = client_settings(load(tmp_path, config_text(lines)).sources[0])

    sasl = get_sasl_mechanism(settings["sasl_mechanism"])(**settings)

    if mechanism == "PLAIN":  # RFC 4616: authzid NUL authcid NUL password
        assert sasl.auth_bytes() == f"{USERNAME}\0{USERNAME}\0{PASSWORD}".encode()
    else:
        assert sasl.mechanism == mechanism
        assert f"n={USERNAME},".encode() in sasl.auth_bytes()  # SCRAM client-first message


@pytest.mark.parametrize("tls", ["ca", "mutual"])
def test_kafka_pythons_ssl_context_loads_the_files(tmp_path: Path, tls: str) -> None:
    """With real certificates (openssl), kafka-python builds its verifying context from them."""
    from testbed.tls_proxy import make_ca

    made = make_ca(tmp_path / "ca")
    certs = {"ca": made.ca_cert, "cert": made.client_cert, "key": made.client_key}
    lines = auth_lines(None, tls, certs)
    settings = client_settings(
        load(tmp_path, config_text(target_lines=lines)).need_target().cluster
    )

    context = KafkaSSLTransport._build_ssl_context({**KafkaSSLTransport.DEFAULT_CONFIG, **settings})

    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname  # ktm keeps kafka-python's hostname check on
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "ktm-test-ca"),),)]


def test_tls_without_a_ca_file_uses_the_system_trust_store(tmp_path: Path) -> None:
    settings = client_settings(
        load(tmp_path, config_text(target_lines="tls = true")).need_target().cluster
    )
    assert settings["security_protocol"] == "SSL"
    assert settings.get("ssl_cafile") is None  # kafka-python then loads the default CAs


def test_mechanism_is_matched_without_regard_to_case(tmp_path: Path) -> None:
    lines = auth_lines("scram-sha-512", "off", {})
    settings = client_settings(load(tmp_path, config_text(lines)).sources[0])
    assert settings["sasl_mechanism"] == "SCRAM-SHA-512"


# --- validation ----------------------------------------------------------------------------------

SECTIONS = {"source": "[[sources]][1]", "target": "[target]"}


def in_section(section: str, lines: str) -> str:
    return config_text(lines) if section == "source" else config_text(target_lines=lines)


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize(
    ("lines", "key", "mentions"),
    [
        pytest.param(
            f'sasl_mechanism = "GSSAPI"\nusername = "u"\npassword = "{PASSWORD}"',
            "sasl_mechanism",
            ("PLAIN, SCRAM-SHA-256, SCRAM-SHA-512", '"GSSAPI"'),
            id="unknown-mechanism",
        ),
        pytest.param(
            f'sasl_mechanism = "PLAIN"\npassword = "{PASSWORD}"',
            "username",
            ('required when sasl_mechanism = "PLAIN"',),
            id="mechanism-without-username",
        ),
        pytest.param(
            'sasl_mechanism = "SCRAM-SHA-256"\nusername = "u"',
            "password",
            ('required when sasl_mechanism = "SCRAM-SHA-256"',),
            id="mechanism-without-password",
        ),
        pytest.param(
            'sasl_mechanism = "PLAIN"\nusername = "u"\npassword = ""',
            "password",
            ("required",),
            id="mechanism-with-empty-password",
        ),
        pytest.param(
            f'username = "u"\npassword = "{PASSWORD}"',
            "username",
            ("set sasl_mechanism",),
            id="username-without-mechanism",
        ),
        pytest.param(
            f'password = "{PASSWORD}"',
            "password",
            ("set sasl_mechanism",),
            id="password-without-mechanism",
        ),
        pytest.param(
            'tls = true\nca_cert_path = "no-such-ca.pem"',
            "ca_cert_path",
            ("file not found", "no-such-ca.pem"),
            id="missing-ca-file",
        ),
        pytest.param(
            'tls = true\nclient_cert_path = "no-such.pem"\nclient_key_path = "KEY"',
            "client_cert_path",
            ("file not found", "no-such.pem"),
            id="missing-client-cert-file",
        ),
        pytest.param(
            'tls = true\nclient_cert_path = "CERT"\nclient_key_path = "no-such.key"',
            "client_key_path",
            ("file not found", "no-such.key"),
            id="missing-client-key-file",
        ),
        pytest.param(
            'tls = true\nclient_cert_path = "CERT"',
            "client_key_path",
            ("required when client_cert_path is set",),
            id="cert-without-key",
        ),
        pytest.param(
            'tls = true\nclient_key_path = "KEY"',
            "client_cert_path",
            ("required when client_key_path is set",),
            id="key-without-cert",
        ),
        pytest.param(
            'ca_cert_path = "CA"',
            "ca_cert_path",
            ("set tls = true",),
            id="certificate-without-tls",
        ),
    ],
)
def test_invalid_auth_or_tls_keys_name_the_key_path(
    tmp_path: Path, section: str, lines: str, key: str, mentions: tuple[str, ...]
) -> None:
    certs = cert_files(tmp_path / "certs")
    lines = (
        lines.replace('"CA"', f'"{certs["ca"]}"')
        .replace('"CERT"', f'"{certs["cert"]}"')
        .replace('"KEY"', f'"{certs["key"]}"')
    )

    message = load_error(tmp_path, in_section(section, lines))

    assert message.startswith(f"{SECTIONS[section]}.{key}: "), message
    for mention in mentions:
        assert mention in message, message


def test_relative_cert_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    cert_files(tmp_path / "certs")
    lines = auth_lines(None, "mutual", {k: Path("certs") / v for k, v in CERT_NAMES.items()})
    cluster = load(tmp_path, config_text(target_lines=lines)).need_target().cluster
    assert cluster.ca_cert_path == str(tmp_path / "certs" / "ca.pem")
    assert cluster.client_key_path == str(tmp_path / "certs" / "client.key")


# --- secrets -------------------------------------------------------------------------------------


def env_password_config(certs: dict[str, Path]) -> str:
    lines = auth_lines("SCRAM-SHA-512", "mutual", certs, password=f"${{{ENV_VAR}}}")
    return config_text(lines, lines)


def test_password_from_an_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, PASSWORD)
    certs = cert_files(tmp_path / "certs")

    cfg = load(tmp_path, env_password_config(certs))

    assert cfg.sources[0].password == Secret(PASSWORD)
    assert client_settings(cfg.sources[0])["sasl_plain_password"] == PASSWORD
    assert producer_settings(cfg.need_target())["sasl_plain_password"] == PASSWORD


def test_unset_password_variable_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    message = load_error(tmp_path, env_password_config(cert_files(tmp_path / "certs")))
    assert message == f"[[sources]][1].password: environment variable {ENV_VAR} is not set"


def test_password_is_hidden_in_repr_str_and_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, PASSWORD)
    cfg = load(tmp_path, env_password_config(cert_files(tmp_path / "certs")))

    redacted = cfg.redacted()

    for shown in (repr(cfg), str(cfg), repr(cfg.target), str(cfg.sources), repr(redacted)):
        assert PASSWORD not in shown
    assert PASSWORD not in json.dumps(redacted)
    assert redacted["sources"][0]["password"] == "***"
    assert redacted["target"]["cluster"]["password"] == "***"
    assert redacted["target"]["cluster"]["username"] == USERNAME  # not a secret


def test_redacted_also_hides_password_like_spark_settings(tmp_path: Path) -> None:
    """Only redacted() (the --debug dump) hides them: [spark.conf] values are plain strings."""
    text = config_text(extra=f'[spark.conf]\n"spark.ssl.keyPassword" = "{PASSWORD}"\n')
    redacted = load(tmp_path, text).redacted()
    assert redacted["spark"]["conf"] == {"spark.ssl.keyPassword": "***"}


@pytest.mark.parametrize(
    "lines",
    [
        pytest.param(f'password = "{PASSWORD}"', id="no-mechanism"),
        pytest.param(f'password = ["{PASSWORD}"]', id="array"),
        pytest.param(f'password = {{ value = "{PASSWORD}" }}', id="inline-table"),
        pytest.param(f'pasword = "{PASSWORD}"', id="misspelt-key"),
        pytest.param(
            f'sasl_mechanism = "PLAN"\nusername = "u"\npassword = "{PASSWORD}"', id="bad-mechanism"
        ),
        pytest.param(
            f'sasl_mechanism = "PLAIN"\nusername = "u"\npassword = "{PASSWORD}"\ntls = "yes"',
            id="bad-tls",
        ),
        pytest.param(
            f'sasl_mechanism = "PLAIN"\npassword = "{PASSWORD}"\nservers = []', id="bad-servers"
        ),
    ],
)
def test_password_never_appears_in_a_config_error(tmp_path: Path, lines: str) -> None:
    load_error(tmp_path, config_text(target_lines=lines))  # asserts the password is absent


# --- a --debug run that cannot connect ---------------------------------------------------------


@pytest.fixture
def restore_process_state() -> Iterator[None]:
    """`ktm relay` replaces the root logger's handlers, sets logger levels and installs signal
    handlers in this (the pytest) process: put everything back afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    noisy = {name: logging.getLogger(name).level for name in ("kafka", "py4j", "pyspark")}
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    root.handlers[:], root.level = saved
    for name, level in noisy.items():
        logging.getLogger(name).setLevel(level)
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


@pytest.mark.timeout(60)
def test_debug_run_that_cannot_connect_never_logs_the_password(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    restore_process_state: None,
) -> None:
    monkeypatch.setenv(ENV_VAR, PASSWORD)
    closed = f"127.0.0.1:{free_port()}"  # nothing listens there
    auth = f'sasl_mechanism = "PLAIN"\nusername = "{USERNAME}"\npassword = "${{{ENV_VAR}}}"'
    fast = 'max_retries = 0\nbackoff_min = "10ms"\nbackoff_max = "10ms"'
    path = tmp_path / "config.toml"
    path.write_text(
        '[app]\nmetrics_addr = ""\n\n[topics]\n"demo" = "demo-copy"\n\n'
        f'[[sources]]\nname = "dc1"\nservers = ["{closed}"]\n{auth}\n\n'
        f'[source_pool]\nrequest_timeout = "100ms"\n{fast}\n\n'
        f'[target]\nservers = ["{closed}"]\n{auth}\nrequest_timeout = "1s"\n{fast}\n'
    )

    result = CliRunner().invoke(
        main, ["relay", "--config", str(path), "--stop-at-end", "--debug"], prog_name="ktm"
    )
    fd_out, fd_err = capfd.readouterr()

    output = result.output + result.stderr + fd_out + fd_err
    assert result.exit_code == 1, output
    assert "config: " in result.stderr and "'password': '***'" in result.stderr  # --debug dump
    errors = [line for line in result.stderr.splitlines() if line.startswith("ktm: error: ")]
    assert len(errors) == 1 and closed in errors[0], result.stderr
    assert PASSWORD not in output
    assert result.exception is None or isinstance(result.exception, SystemExit)


# --- the hand-made login (relay/clients/login.py) ---------------------------------------------


class _ScramServer:
    """The server's side of RFC 7677's SCRAM-SHA-256 example (user "user", password "pencil")."""

    FIRST = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"

    def __init__(self) -> None:
        self.tokens: list[bytes] = []

    def sasl_authenticate(self, token: bytes) -> bytes:
        self.tokens.append(token)
        return self.FIRST.encode() if len(self.tokens) == 1 else b"v=..."


def test_the_scram_login_computes_rfc_7677s_proof(monkeypatch: pytest.MonkeyPatch) -> None:
    from relay.clients import login

    monkeypatch.setattr(login.secrets, "token_urlsafe", lambda size: "rOprNGfwEbeRWgbNEkqO")
    server = _ScramServer()

    login._scram(server, "SCRAM-SHA-256", "user", "pencil")  # type: ignore[arg-type]

    assert server.tokens == [
        b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
    ]


def test_no_login_is_made_for_a_plaintext_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_login before each first client: nothing to check without TLS or SASL (no socket
    is opened: the address does not exist)."""
    from relay.clients import login
    from relay.config import ClusterConfig

    monkeypatch.setattr(login, "_login", lambda *a: pytest.fail("logged in to a plain cluster"))
    login.check_login(ClusterConfig("src", ("nowhere.invalid:9092",)), 1.0)


def test_no_server_taking_a_connection_is_a_connection_error_at_once() -> None:
    """Retriable, and without waiting for kafka-python's bootstrap timeout as well."""
    from relay.clients import login
    from relay.config import ClusterConfig

    closed = f"127.0.0.1:{free_port()}"  # nothing listens there
    cluster = ClusterConfig("src", (closed, closed), sasl_mechanism="PLAIN", username=USERNAME,
                            password=Secret(PASSWORD), section="[[sources]][1]")  # fmt: skip
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="no broker answered"):
        login.check_login(cluster, 5.0)
    assert time.monotonic() - started < 1.0
    assert login.login_problem(cluster, 5.0) is None
