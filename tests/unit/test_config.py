"""relay.config: defaults, every key, the sample file, and one readable line per error."""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import tomli

from relay.config import (
    AclsConfig,
    AppConfig,
    ClusterConfig,
    Config,
    FilterConfig,
    LimitsConfig,
    Secret,
    SourcePoolConfig,
    SparkConfig,
    StoreConfig,
    TargetConfig,
    TopicRoute,
    VerifyConfig,
    load_config,
    parse_duration,
)
from relay.errors import ConfigError

SAMPLE = Path(__file__).resolve().parents[2] / "config.sample.toml"
SOURCE = 'name = "local"\nservers = ["127.0.0.1:19092"]'
TARGET = 'servers = ["127.0.0.1:19093"]'
TOPICS = '"demo" = "demo-copy"'
PASSWORD = "hunter2-do-not-print"


def make(
    *, topics: str = TOPICS, source: str = SOURCE, target: str = TARGET, extra: str = ""
) -> str:
    """A config text: the three required sections, each with extra lines, then `extra`."""
    return f"[topics]\n{topics}\n\n[[sources]]\n{source}\n\n[target]\n{target}\n\n{extra}\n"


def load(tmp_path: Path, text: str, cli_filters: tuple[str, ...] = ()) -> Config:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_config(path, cli_filters=cli_filters)


def load_error(tmp_path: Path, text: str, cli_filters: tuple[str, ...] = ()) -> str:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text, cli_filters)
    message = str(caught.value)
    assert "\n" not in message
    return message


def touch(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# Defaults and every key


def test_defaults_of_every_key(tmp_path: Path) -> None:
    config = load(tmp_path, make())

    assert config.path == str(tmp_path / "config.toml")
    assert config.app == AppConfig(
        log_level="info", metrics_addr=("127.0.0.1", 7081), group_id="ktm", stuck_after=120.0
    )
    assert config.spark == SparkConfig(
        master=None, app_name="ktm", slots=0, rebalance_interval=30.0, control_port=0, conf=()
    )
    assert config.topics == (TopicRoute(source="demo", target="demo-copy", partition=None),)
    assert config.sources == (
        ClusterConfig(
            name="local",
            servers=("127.0.0.1:19092",),
            sasl_mechanism=None,
            username=None,
            password=None,
            tls=False,
            ca_cert_path=None,
            client_cert_path=None,
            client_key_path=None,
            isolation_level="read_committed",  # [source_pool]'s, on every source
        ),
    )
    assert config.source_pool == SourcePoolConfig(
        healthcheck_interval=3.0,
        request_timeout=2.0,
        offset_lag_threshold=1000,
        max_retries=-1,
        backoff_min=1.0,
        backoff_max=10.0,
        randomize_initial=False,
        on_mismatch="stop",
        on_loss="warn",
        isolation_level="read_committed",
    )
    assert config.target == TargetConfig(  # the target is read whole (ktm writes no transaction)
        cluster=ClusterConfig(name="target", servers=("127.0.0.1:19093",)),
        compression="none",
        linger=0.0,
        batch_size=262144,
        max_retries=5,
        backoff_min=0.5,
        backoff_max=10.0,
        acks="all",
        request_timeout=30.0,
    )
    assert config.filters == ()


FULL = """
[app]
log_level = "DEBUG"
metrics_addr = ":9100"
group_id = "mirror"
stuck_after = "30s"

[spark]
master = "local[3]"
app_name = "mirror-app"
slots = 6
rebalance_interval = "1m"
control_port = 7090

[spark.conf]
"spark.ui.enabled" = false
"spark.task.maxFailures" = 4
"spark.executor.memory" = "2g"

[topics]
"orders.v1" = "orders-copy:3"
"clicks" = "clicks-copy"

[source_pool]
healthcheck_interval = "250ms"
request_timeout = 2
offset_lag_threshold = 50
max_retries = 7
backoff_min = "2s"
backoff_max = "1m"
randomize_initial = true
on_mismatch = "continue"
on_loss = "stop"
isolation_level = "READ_UNCOMMITTED"

[[sources]]
name = "east"
servers = ["east-1:9092", "east-2:9093"]
sasl_mechanism = "scram-sha-256"
username = "relay"
password = "hunter2-do-not-print"
tls = true
ca_cert_path = "certs/ca.pem"
client_cert_path = "certs/client.pem"
client_key_path = "certs/client.key"

[[sources]]
name = "west"
servers = ["west-1:9092"]

[target]
servers = ["dest:9094"]
sasl_mechanism = "PLAIN"
username = "writer"
password = "target-pw"
tls = true
ca_cert_path = "certs/ca.pem"
compression = "zstd"
linger = "20ms"
batch_size = 1048576
max_retries = -1
backoff_min = "100ms"
backoff_max = "2s"
acks = 1
request_timeout = "45s"

[filters.pii]
path = "filters/pii.py"
enabled = true
on_error = "skip"

[filters.pii.config]
fields = ["email", "phone"]
limits = { max = 3 }

[filters.off]
path = "filters/off.py"
enabled = false
"""


def test_every_key_is_read(tmp_path: Path) -> None:
    for name in ("certs/ca.pem", "certs/client.pem", "certs/client.key"):
        touch(tmp_path / name)
    touch(tmp_path / "filters" / "pii.py")
    touch(tmp_path / "filters" / "off.py")
    certs = tmp_path / "certs"

    config = load(tmp_path, FULL)

    assert config.app == AppConfig(
        log_level="debug", metrics_addr=("0.0.0.0", 9100), group_id="mirror", stuck_after=30.0
    )
    assert config.spark == SparkConfig(
        master="local[3]",
        app_name="mirror-app",
        slots=6,
        rebalance_interval=60.0,
        control_port=7090,
        conf=(
            ("spark.executor.memory", "2g"),
            ("spark.task.maxFailures", "4"),
            ("spark.ui.enabled", "false"),
        ),
    )
    assert config.topics == (
        TopicRoute("orders.v1", "orders-copy", 3),
        TopicRoute("clicks", "clicks-copy", None),
    )
    assert config.source_pool == SourcePoolConfig(
        healthcheck_interval=0.25,
        request_timeout=2.0,
        offset_lag_threshold=50,
        max_retries=7,
        backoff_min=2.0,
        backoff_max=60.0,
        randomize_initial=True,
        on_mismatch="continue",
        on_loss="stop",
        isolation_level="read_uncommitted",
    )
    assert config.sources == (
        ClusterConfig(
            name="east",
            servers=("east-1:9092", "east-2:9093"),
            sasl_mechanism="SCRAM-SHA-256",
            username="relay",
            password=Secret(PASSWORD),
            tls=True,
            ca_cert_path=str(certs / "ca.pem"),
            client_cert_path=str(certs / "client.pem"),
            client_key_path=str(certs / "client.key"),
            isolation_level="read_uncommitted",
        ),
        ClusterConfig(name="west", servers=("west-1:9092",), isolation_level="read_uncommitted"),
    )
    assert config.target == TargetConfig(
        cluster=ClusterConfig(
            name="target",
            servers=("dest:9094",),
            sasl_mechanism="PLAIN",
            username="writer",
            password=Secret("target-pw"),
            tls=True,
            ca_cert_path=str(certs / "ca.pem"),
        ),
        compression="zstd",
        linger=0.02,
        batch_size=1048576,
        max_retries=-1,
        backoff_min=0.1,
        backoff_max=2.0,
        acks="1",
        request_timeout=45.0,
    )
    assert config.filters == (
        FilterConfig(
            id="pii",
            path=str(tmp_path / "filters" / "pii.py"),
            enabled=True,
            on_error="skip",
            config=(("fields", ["email", "phone"]), ("limits", {"max": 3})),
        ),
    )


def test_filter_config_dict_is_a_copy(tmp_path: Path) -> None:
    touch(tmp_path / "f.py")
    extra = '[filters.f]\npath = "f.py"\n[filters.f.config]\nnested = { list = [1, 2] }\n'
    config = load(tmp_path, make(extra=extra))

    nested = config.filters[0].config_dict()["nested"]
    assert isinstance(nested, dict) and isinstance(nested["list"], list)
    nested["list"].append(3)

    assert config.filters[0].config_dict() == {"nested": {"list": [1, 2]}}


def test_configs_sent_to_executors_pickle(tmp_path: Path) -> None:
    touch(tmp_path / "f.py")
    text = make(target=TARGET + '\nsasl_mechanism = "PLAIN"\nusername = "u"\npassword = "p"')
    config = load(tmp_path, text + '[filters.f]\npath = "f.py"\n[filters.f.config]\na = {b = 1}\n')

    for value in (config, config.sources[0], config.topics[0], config.target, config.filters[0]):
        assert pickle.loads(pickle.dumps(value)) == value


# The sample file


def uncommented_sample(directory: Path) -> Path:
    """The sample with every commented-out key and section switched on, and the files it names."""
    lines = []
    setting = re.compile(r'# ((?:[\w.-]+|"[^"]+") = (?:"[^"]*"|\[[^\]]*\]|[\w.-]+)|\[[\w.]+\])')
    for line in SAMPLE.read_text().splitlines():
        match = setting.fullmatch(line)
        lines.append(match.group(1) if match else line)
    text = "\n".join(lines).replace("tls = false", "tls = true")
    # The S3 keys go with an s3:// URL.
    text = text.replace('url = "./backup"', 'url = "s3://ktm-backup/prod"')
    for name in ("certs/ca.pem", "certs/client.pem", "certs/client.key", "filters/drop_pii.py"):
        touch(directory / name)
    path = directory / "config.toml"
    path.write_text(text)
    return path


def test_sample_loads_with_its_defaults(tmp_path: Path) -> None:
    # The sample spells out every default, so loading it must give the dataclasses' defaults.
    shutil.copy(SAMPLE, tmp_path / "config.toml")
    config = load_config(tmp_path / "config.toml")

    assert config.sources == (
        ClusterConfig(name="local", servers=("127.0.0.1:19092",), isolation_level="read_committed"),
    )
    assert config.target == TargetConfig(ClusterConfig(name="target", servers=("127.0.0.1:19093",)))
    assert config.topics == (TopicRoute("demo", "demo-copy"),)
    assert (config.app, config.spark, config.source_pool) == (
        AppConfig(),
        SparkConfig(),
        SourcePoolConfig(),
    )
    assert config.source_pool.fetch.idle_wait == 0.5  # what the tasks' fetchers get
    assert config.filters == ()
    assert config.store == StoreConfig(url=str(tmp_path / "backup"), cluster="local")


def test_sample_commented_keys_are_valid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTM_SOURCE_PASSWORD", "s")
    monkeypatch.setenv("KTM_TARGET_PASSWORD", "t")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")

    config = load_config(uncommented_sample(tmp_path))

    assert config.sources[0].password == Secret("s")
    assert config.need_target().cluster.client_key_path == str(tmp_path / "certs" / "client.key")
    assert config.spark.conf == (("spark.executor.memory", "1g"),)
    assert config.filters[0].config_dict() == {"fields": ["email", "phone"]}
    assert config.store is not None and config.store.cluster == "prod-eu"
    assert config.store.s3_secret_key == Secret("secret")


def test_sample_documents_every_key(tmp_path: Path) -> None:
    doc = tomli.loads(uncommented_sample(tmp_path).read_text())

    def names(cls: Any, *without: str) -> set[str]:
        """The fields read from TOML keys (a derived field, set at start-up, has no reader)."""
        return {f.name for f in dataclasses.fields(cls) if "read" in f.metadata} - set(without)

    assert set(doc) == {f.name for f in dataclasses.fields(Config)} - {"path"}
    assert set(doc["app"]) == names(AppConfig)
    assert set(doc["spark"]) == names(SparkConfig)
    assert set(doc["source_pool"]) == names(SourcePoolConfig)
    assert set(doc["sources"][0]) == names(ClusterConfig)
    assert set(doc["target"]) == names(ClusterConfig, "name") | names(TargetConfig, "cluster")
    assert set(doc["filters"]["drop_pii"]) == names(FilterConfig, "id", "from_section")
    assert set(doc["store"]) == names(StoreConfig)
    assert set(doc["limits"]) == names(LimitsConfig)
    assert set(doc["verify"]) == names(VerifyConfig)
    assert set(doc["acls"]) == names(AclsConfig)


# Durations, topics, small parsers


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500us", 0.0005),
        ("20ms", 0.02),
        ("3s", 3.0),
        ("1.5s", 1.5),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("0s", 0.0),
        (2, 2.0),
        (0.25, 0.25),
    ],
)
def test_parse_duration(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "3", "3 s", "-1s", "1d", "s", "abc", -1, True, float("inf")])
def test_parse_duration_rejects(text: Any) -> None:
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "route"),
    [
        ('"dest"', TopicRoute("src", "dest", None)),
        ('"dest:0"', TopicRoute("src", "dest", 0)),
        ('"dest:12"', TopicRoute("src", "dest", 12)),
        ('"my.dest_v-2:5"', TopicRoute("src", "my.dest_v-2", 5)),
    ],
)
def test_topic_route(tmp_path: Path, value: str, route: TopicRoute) -> None:
    assert load(tmp_path, make(topics=f'"src" = {value}')).topics == (route,)


def test_topics_keep_file_order_and_may_share_a_target(tmp_path: Path) -> None:
    config = load(tmp_path, make(topics='b = "same"\na = "same:1"\nc = "other"'))

    assert [(r.source, r.target, r.partition) for r in config.topics] == [
        ("b", "same", None),
        ("a", "same", 1),
        ("c", "other", None),
    ]


@pytest.mark.parametrize(
    ("value", "acks"),
    [
        ('"all"', "all"),
        ('"ALL"', "all"),
        (-1, "all"),
        (0, "0"),
        (1, "1"),
        ('"0"', "0"),
        ('"1"', "1"),
    ],
)
def test_acks(tmp_path: Path, value: Any, acks: str) -> None:
    assert load(tmp_path, make(target=f"{TARGET}\nacks = {value}")).need_target().acks == acks


@pytest.mark.parametrize(
    ("value", "address"),
    [
        ('":7081"', ("0.0.0.0", 7081)),
        ('""', None),
        ('"10.1.2.3:9000"', ("10.1.2.3", 9000)),
        ('"[::1]:7081"', ("::1", 7081)),
    ],
)
def test_metrics_addr(tmp_path: Path, value: str, address: tuple[str, int] | None) -> None:
    assert load(tmp_path, make(extra=f"[app]\nmetrics_addr = {value}")).app.metrics_addr == address


def test_empty_optional_strings_mean_not_set(tmp_path: Path) -> None:
    config = load(
        tmp_path, make(target=f'{TARGET}\nsasl_mechanism = ""\nusername = ""\npassword = ""')
    )

    target = config.need_target().cluster
    assert (target.sasl_mechanism, target.username) == (None, None)
    assert config.need_target().cluster.password is None


def test_cert_paths_are_relative_to_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    touch(tmp_path / "conf" / "ca.pem")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    path = touch(
        tmp_path / "conf" / "ktm.toml",
        make(target=f'{TARGET}\ntls = true\nca_cert_path = "ca.pem"'),
    )

    assert load_config(path).need_target().cluster.ca_cert_path == str(tmp_path / "conf" / "ca.pem")


# Environment and secrets


def test_environment_variables_are_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KTM_TEST_HOST", "10.0.0.7")
    monkeypatch.setenv("KTM_TARGET_PASSWORD", PASSWORD)
    target = (
        'servers = ["${KTM_TEST_HOST}:9092"]\nsasl_mechanism = "PLAIN"\n'
        'username = "u-${KTM_TEST_HOST}"\npassword = "${KTM_TARGET_PASSWORD}"'
    )
    config = load(tmp_path, make(target=target))

    assert config.need_target().cluster.servers == ("10.0.0.7:9092",)
    assert config.need_target().cluster.username == "u-10.0.0.7"
    assert config.need_target().cluster.password == Secret(PASSWORD)


def test_unset_environment_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KTM_TARGET_PASSWORD", raising=False)
    auth = 'sasl_mechanism = "PLAIN"\nusername = "u"\npassword = "${KTM_TARGET_PASSWORD}"'

    message = load_error(tmp_path, make(target=f"{TARGET}\n{auth}"))

    assert message == "[target].password: environment variable KTM_TARGET_PASSWORD is not set"


def test_secrets_never_show(tmp_path: Path) -> None:
    target = f'{TARGET}\nsasl_mechanism = "PLAIN"\nusername = "u"\npassword = "{PASSWORD}"'
    extra = f'[spark.conf]\n"spark.ssl.keyPassword" = "{PASSWORD}"'
    config = load(tmp_path, make(target=target, extra=extra))
    password = config.need_target().cluster.password

    assert password is not None and password.value == PASSWORD
    assert repr(password) == str(password) == "***"
    assert PASSWORD not in repr(config.target) and PASSWORD not in str(config.need_target().cluster)
    dumped = json.dumps(config.redacted())
    assert PASSWORD not in dumped
    assert config.redacted()["target"]["cluster"]["password"] == "***"
    assert config.redacted()["spark"]["conf"] == {"spark.ssl.keyPassword": "***"}


@pytest.mark.parametrize(
    "target",
    [
        f'sasl_mechanism = "GSSAPI"\nusername = "u"\npassword = "{PASSWORD}"',
        f'password = "{PASSWORD}"',  # without a mechanism
        f'sasl_mechanism = "PLAIN"\npassword = "{PASSWORD}"',  # without a username
    ],
)
def test_secrets_stay_out_of_errors(tmp_path: Path, target: str) -> None:
    message = load_error(tmp_path, make(target=f"{TARGET}\n{target}"))

    assert "[target]." in message
    assert PASSWORD not in message


def test_bad_password_type_names_the_type(tmp_path: Path) -> None:
    message = load_error(tmp_path, make(target=f"{TARGET}\npassword = 12345"))

    assert message == "[target].password: expected a string, got an integer"


# Errors: each names the key path and the bad value


# (part, lines, texts): "target+"/"source+" add lines to the minimal [target]/[[sources]];
# "source", "topics" and "extra" replace that part. Each text must be in the message; {tmp} is
# the directory holding the config file.
ERRORS = [
    pytest.param(
        "target+",
        'max_retries = "x"',
        ['[target].max_retries: expected an integer >= -1, got "x"'],
        id="target-retries-str",
    ),
    pytest.param(
        "target+", "max_retries = -2", ["[target].max_retries", "-2"], id="target-retries-low"
    ),
    pytest.param(
        "target+", "max_retries = true", ["[target].max_retries", "true"], id="target-retries-bool"
    ),
    pytest.param(
        "source",
        'name = "a"\nservers = []',
        ['[[sources]][1].servers: expected a non-empty list of "host:port" strings, got []'],
        id="source-servers-empty",
    ),
    pytest.param(
        "source",
        'name = "a"\nservers = ["kafka"]',
        ["[[sources]][1].servers", '"kafka"'],
        id="source-servers-no-port",
    ),
    pytest.param(
        "source",
        'name = "a"\nservers = ["k:70000"]',
        ["[[sources]][1].servers", '"k:70000"'],
        id="source-servers-port",
    ),
    pytest.param(
        "source",
        'name = "a"\nservers = "k:9092"',
        ["[[sources]][1].servers", '"k:9092"'],
        id="source-servers-string",
    ),
    pytest.param(
        "source", 'name = "a"', ["[[sources]][1].servers: missing"], id="source-servers-missing"
    ),
    pytest.param(
        "source", 'servers = ["k:1"]', ["[[sources]][1].name: missing"], id="source-name-missing"
    ),
    pytest.param(
        "source",
        'name = ""\nservers = ["k:1"]',
        ['[[sources]][1].name: expected a non-empty string, got ""'],
        id="source-name-empty",
    ),
    pytest.param(
        "source+",
        "session_timeout = 3",
        ["[[sources]][1].session_timeout: unknown key"],
        id="source-unknown",
    ),
    pytest.param(
        "extra",
        '[[sources]]\nname = "local"\nservers = ["127.0.0.1:19092"]',
        ['[[sources]][2].name: "local" is already used by [[sources]][1]'],
        id="source-name-dup",
    ),
    pytest.param("extra", "[app]\nbogus = 1", ["[app].bogus: unknown key"], id="app-unknown"),
    pytest.param(
        "extra",
        '[app]\nlog_levl = "info"',
        ["[app].log_levl: unknown key (did you mean log_level?)"],
        id="app-typo",
    ),
    pytest.param("target+", "name = 'x'", ["[target].name: unknown key"], id="target-unknown"),
    pytest.param(
        "extra",
        "[taget]\nx = 1",
        ["taget: unknown key (did you mean target?)"],
        id="top-level-unknown",
    ),
    pytest.param(
        "extra",
        '[app]\nlog_level = "verbose"',
        ['[app].log_level: expected one of debug, info, warning, error, got "verbose"'],
        id="log-level",
    ),
    pytest.param(
        "extra",
        '[app]\nmetrics_addr = "localhost"',
        ["[app].metrics_addr", '"localhost"'],
        id="metrics-addr",
    ),
    pytest.param(
        "extra", '[app]\nmetrics_addr = ":0"', ["[app].metrics_addr", '":0"'], id="metrics-port"
    ),
    pytest.param("extra", '[app]\ngroup_id = ""', ["[app].group_id", '""'], id="group-id"),
    pytest.param("extra", "[spark]\nmaster = 4", ["[spark].master", "4"], id="master-type"),
    pytest.param(
        "extra",
        '[spark]\nepoch_duration = "5s"',
        ["[spark].epoch_duration: removed in ktm 0.2", "rebalance_interval"],
        id="epoch-removed",
    ),
    pytest.param(
        "extra",
        '[spark]\nrebalance_interval = "0s"',
        ['[spark].rebalance_interval: expected a duration > 0, got "0s"'],
        id="rebalance-zero",
    ),
    pytest.param("extra", "[spark]\nslots = -1", ["[spark].slots", "-1"], id="slots-negative"),
    pytest.param(
        "extra", "[spark]\ncontrol_port = 70000", ["[spark].control_port", "70000"], id="port"
    ),
    pytest.param(
        "extra",
        '[spark.conf]\n"spark.x" = [1]',
        ['[spark.conf]."spark.x"', "[1]"],
        id="spark-conf-array",
    ),
    pytest.param(
        "extra",
        "[spark.conf]\nspark.x = 1",
        ['[spark.conf]."spark"', "quote dotted keys"],
        id="spark-conf-dotted",
    ),
    pytest.param(
        "target+",
        'linger = "5 ms"',
        ['[target].linger: expected a duration >= 0 such as "3s" or "100ms", got "5 ms"'],
        id="linger-malformed",
    ),
    pytest.param("target+", "linger = -1", ["[target].linger", "-1"], id="linger-negative"),
    pytest.param(
        "target+", 'linger = "-1s"', ["[target].linger", '"-1s"'], id="linger-negative-str"
    ),
    pytest.param("target+", "linger = true", ["[target].linger", "true"], id="linger-bool"),
    pytest.param(
        "target+",
        "request_timeout = 0",
        ["[target].request_timeout: expected a duration > 0, got 0"],
        id="timeout-zero",
    ),
    pytest.param(
        "target+",
        'tls = "true"',
        ['[target].tls: expected true or false, got "true"'],
        id="tls-string",
    ),
    pytest.param(
        "target+",
        'compression = "brotli"',
        ['[target].compression: expected one of none, gzip, snappy, lz4, zstd, got "brotli"'],
        id="compression",
    ),
    pytest.param(
        "target+",
        "batch_size = 100",
        ["[target].batch_size: expected an integer from 1024 to 67108864, got 100"],
        id="batch-small",
    ),
    pytest.param(
        "target+", "batch_size = 2048.0", ["[target].batch_size", "2048.0"], id="batch-float"
    ),
    pytest.param(
        "target+", "acks = 2", ['[target].acks: expected "all" (or -1), 1 or 0, got 2'], id="acks-2"
    ),
    pytest.param("target+", 'acks = "some"', ["[target].acks", '"some"'], id="acks-word"),
    pytest.param(
        "target+",
        'backoff_min = "20s"\nbackoff_max = "10s"',
        ["[target].backoff_max: expected >= backoff_min (20s), got 10s"],
        id="target-backoff",
    ),
    pytest.param(
        "extra",
        '[source_pool]\nbackoff_max = "500ms"',
        ["[source_pool].backoff_max: expected >= backoff_min (1s), got 0.5s"],
        id="pool-backoff",
    ),
    pytest.param(
        "extra",
        "[source_pool]\noffset_lag_threshold = -1",
        ["[source_pool].offset_lag_threshold: expected an integer >= 0, got -1"],
        id="pool-lag",
    ),
    pytest.param(
        "extra",
        '[source_pool]\nisolation_level = "committed"',
        [
            "[source_pool].isolation_level: expected one of read_committed, read_uncommitted, "
            'got "committed"'
        ],
        id="pool-isolation",
    ),
    pytest.param(
        "extra",
        '[source_pool]\non_loss = "ignore"',
        ['[source_pool].on_loss: expected one of warn, stop, got "ignore"'],
        id="pool-on-loss",
    ),
    pytest.param(
        "extra",
        '[source_pool]\nmax_retries = "3"',
        ['[source_pool].max_retries: expected an integer >= -1, got "3"'],
        id="pool-retries",
    ),
    pytest.param(
        "extra",
        '[source_pool]\nfetch_timeout = "500ms"',
        ['[source_pool].fetch_timeout: expected a duration >= 1s, got "500ms"'],
        id="pool-fetch-timeout",
    ),
    pytest.param(
        "extra",
        '[source_pool]\nfetch_max_bytes = "1KiB"',
        ['[source_pool].fetch_max_bytes: expected at least 65536 bytes, got "1KiB"'],
        id="pool-fetch-max-bytes",
    ),
    pytest.param(
        "extra",
        '[source_pool]\nfetch_partition_max_bytes = "lots"',
        ["[source_pool].fetch_partition_max_bytes", '"lots"'],
        id="pool-fetch-partition-bytes",
    ),
    pytest.param(
        "extra",
        "[source_pool]\nfetch_min_bytes = 0",
        ["[source_pool].fetch_min_bytes: expected at least 1 bytes, got 0"],
        id="pool-fetch-min-bytes",
    ),
    pytest.param(
        "extra",
        '[source_pool]\nfetch_max_wait = "11s"',
        ['[source_pool].fetch_max_wait: expected a duration > 0 and <= 10s, got "11s"'],
        id="pool-fetch-max-wait",
    ),
    pytest.param(
        "extra",
        '[source_pool]\nfetch_idle_wait = "11s"',
        ['[source_pool].fetch_idle_wait: expected a duration > 0 and <= 10s, got "11s"'],
        id="pool-fetch-idle-wait",
    ),
    pytest.param(
        "extra",
        "[source_pool]\nfetch_in_flight = 0",
        ["[source_pool].fetch_in_flight: expected an integer from 1 to 8, got 0"],
        id="pool-fetch-in-flight",
    ),
    pytest.param(
        "target+",
        "max_in_flight = 6",
        ["[target].max_in_flight: expected an integer from 1 to 5, got 6"],
        id="target-in-flight",
    ),
    pytest.param(
        "target+",
        'buffer_memory = "64KiB"',
        ['[target].buffer_memory: expected at least 1048576 bytes, got "64KiB"'],
        id="target-buffer-memory",
    ),
    pytest.param(
        "extra",
        '[app]\npartition_metrics = "no"',
        ['[app].partition_metrics: expected true or false, got "no"'],
        id="partition-metrics",
    ),
    pytest.param(
        "extra",
        '[source_pool]\nhealthcheck_interval = "0ms"',
        ["[source_pool].healthcheck_interval", '"0ms"'],
        id="pool-interval",
    ),
    pytest.param(
        "extra",
        "[source_pool]\nrandomize_initial = 1",
        ["[source_pool].randomize_initial: expected true or false, got 1"],
        id="pool-randomize",
    ),
    pytest.param(
        "target+",
        'sasl_mechanism = "GSSAPI"',
        [
            "[target].sasl_mechanism: expected one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, got",
            "GSSAPI",
        ],
        id="mechanism",
    ),
    pytest.param(
        "target+",
        'sasl_mechanism = "PLAIN"\npassword = "p"',
        ['[target].username: required when sasl_mechanism = "PLAIN"'],
        id="mechanism-no-user",
    ),
    pytest.param(
        "target+",
        'sasl_mechanism = "PLAIN"\nusername = "u"',
        ['[target].password: required when sasl_mechanism = "PLAIN"'],
        id="mechanism-no-password",
    ),
    pytest.param(
        "source+",
        'username = "alice"',
        ["[[sources]][1].username: set sasl_mechanism", '"alice"'],
        id="user-no-mechanism",
    ),
    pytest.param(
        "target+",
        'password = "p"',
        ["[target].password: set sasl_mechanism"],
        id="password-no-mechanism",
    ),
    pytest.param(
        "target+",
        'ca_cert_path = "ca.pem"',
        ["[target].ca_cert_path: set tls = true to use certificates"],
        id="cert-without-tls",
    ),
    pytest.param(
        "target+",
        'tls = true\nca_cert_path = "nope.pem"',
        ["[target].ca_cert_path: file not found: {tmp}/nope.pem"],
        id="cert-missing",
    ),
    pytest.param(
        "target+",
        'tls = true\nclient_cert_path = "ca.pem"',
        ['[target].client_key_path: required when client_cert_path is set ("{tmp}/ca.pem")'],
        id="cert-without-key",
    ),
    pytest.param(
        "target+",
        'tls = true\nclient_key_path = "ca.pem"',
        ["[target].client_cert_path: required when client_key_path is set"],
        id="key-without-cert",
    ),
    pytest.param(
        "topics",
        '"src" = "dest:x"',
        ['[topics]."src": expected "target-topic" or "target-topic:partition", got "dest:x"'],
        id="topic-bad-partition",
    ),
    pytest.param("topics", '"src" = ":3"', ['[topics]."src"', '":3"'], id="topic-no-target"),
    pytest.param("topics", '"src" = ""', ['[topics]."src"', '""'], id="topic-empty"),
    pytest.param(
        "topics", '"src" = "dest:-1"', ['[topics]."src"', '"dest:-1"'], id="topic-negative"
    ),
    pytest.param("topics", '"src" = 5', ['[topics]."src"', "5"], id="topic-number"),
    pytest.param(
        "topics",
        '"a b" = "c"',
        ['[topics]."a b": not a valid Kafka topic name'],
        id="topic-bad-source",
    ),
    pytest.param("topics", "", ["[topics]: no topics to relay"], id="topics-empty"),
    pytest.param(
        "extra",
        "[filters.pii]\nenabled = true",
        ["[filters.pii].path: missing"],
        id="filter-no-path",
    ),
    pytest.param(
        "extra",
        '[filters.pii]\npath = "nope.py"',
        ["[filters.pii].path: file not found: {tmp}/nope.py"],
        id="filter-path-missing",
    ),
    pytest.param(
        "extra",
        '[filters.pii]\npath = "ca.pem"\non_error = "ignore"',
        ['[filters.pii].on_error: expected one of stop, skip, got "ignore"'],
        id="filter-on-error",
    ),
    pytest.param(
        "extra",
        '[filters.pii]\npath = "ca.pem"\nenabled = "no"',
        ['[filters.pii].enabled: expected true or false, got "no"'],
        id="filter-enabled",
    ),
    pytest.param(
        "extra",
        '[filters.pii]\npath = "ca.pem"\nfile = "x"',
        ["[filters.pii].file: unknown key"],
        id="filter-unknown",
    ),
    pytest.param(
        "extra",
        '[filters]\npii = "x.py"',
        ['[filters.pii]: expected a table, got "x.py"'],
        id="filter-not-table",
    ),
    pytest.param("extra", "[app]\nspark = 1", ["[app].spark: unknown key"], id="spark-not-table"),
    pytest.param(
        "extra",
        '[discover]\ninclude = ["orders(", "x"]',
        ['[discover].include: item 1 "orders(" is not a regex: missing ), unterminated subpattern'],
        id="discover-bad-regex",
    ),
    pytest.param(
        "extra",
        '[discover]\ninclude = [".*"]\nrename = "east.orders"',
        ['[discover].rename: expected a topic name holding "{{topic}}" once', '"east.orders"'],
        id="discover-rename-without-topic",
    ),
    pytest.param(
        "extra",
        '[discover]\nstart = "latest"',
        ['[discover].start: expected one of beginning, end, got "latest"'],
        id="discover-start",
    ),
    pytest.param(
        "extra",
        '[discover]\nfrom_target_prefix = "a b"',
        ['[discover].from_target_prefix: expected a topic name prefix such as "east."'],
        id="discover-prefix",
    ),
    pytest.param(
        "extra",
        '[groups]\ninclude = "billing"',
        ['[groups].include: expected a list of non-empty strings, got "billing"'],
        id="groups-not-a-list",
    ),
    pytest.param(
        "extra",
        '[groups]\ninterval = "100ms"',
        ["[groups].interval: expected a duration >= 0.5s"],
        id="groups-interval",
    ),
    pytest.param(
        "extra",
        "[acls]\nsync = 1",
        ["[acls].sync: expected true or false, got 1"],
        id="acls-sync",
    ),
    pytest.param(
        "extra",
        '[acls]\ninterval = "500ms"',
        ['[acls].interval: expected a duration >= 1s, got "500ms"'],
        id="acls-interval",
    ),
    pytest.param(
        "extra",
        '[acls]\nprincipals = ["User:(alice"]',
        ['[acls].principals: item 1 "User:(alice" is not a regex'],
        id="acls-principals",
    ),
    pytest.param(
        "extra",
        '[acls]\nexclude = "User:bob"',
        ['[acls].exclude: expected a list of non-empty strings, got "User:bob"'],
        id="acls-exclude",
    ),
    pytest.param(
        "target+",
        'config_sync = "yes"',
        ['[target].config_sync: expected true or false, got "yes"'],
        id="config-sync",
    ),
    pytest.param(
        "target+",
        'config_sync_interval = "0s"',
        ['[target].config_sync_interval: expected a duration >= 1s, got "0s"'],
        id="config-sync-interval",
    ),
    pytest.param(
        "target+",
        "replication_factor = 0",
        ["[target].replication_factor: expected -1 (the broker's default) or 1 to 32767, got 0"],
        id="replication-factor",
    ),
]


@pytest.mark.parametrize(("part", "lines", "texts"), ERRORS)
def test_error_names_key_and_value(tmp_path: Path, part: str, lines: str, texts: list[str]) -> None:
    touch(tmp_path / "ca.pem")
    parts = {"topics": TOPICS, "source": SOURCE, "target": TARGET, "extra": ""}
    if part.endswith("+"):
        parts[part.rstrip("+")] += "\n" + lines
    else:
        parts[part] = lines

    message = load_error(tmp_path, make(**parts))

    for text in texts:
        assert text.format(tmp=tmp_path) in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (make().replace("[target]\n" + TARGET, ""), "[target]: missing section"),
        (make().replace("[topics]\n" + TOPICS, ""), "[topics]: missing section"),
        (make().replace("[[sources]]\n" + SOURCE, ""), "[[sources]]: missing"),
        (make().replace("[[sources]]", "[sources]"), "[sources]: write [[sources]]"),
        ("app = 3\n" + make(), "[app]: expected a table, got 3"),
    ],
    ids=["no-target", "no-topics", "no-sources", "sources-table", "app-not-table"],
)
def test_missing_or_misshapen_sections(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in load_error(tmp_path, text)


def test_malformed_toml_names_line_and_column(tmp_path: Path) -> None:
    message = load_error(tmp_path, "[app]\nlog_level = 'info'\ngroup_id = \n")

    assert (
        message == f"{tmp_path / 'config.toml'}: invalid TOML at line 3, column 12: Invalid value"
    )


def test_missing_file_is_named_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    with pytest.raises(ConfigError, match=r"^nope/config\.toml: file not found$"):
        load_config("nope/config.toml")


# Filters named on the command line


def test_cli_filter_enables_the_section_with_the_same_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pii = touch(tmp_path / "filters" / "pii.py")
    touch(tmp_path / "filters" / "unused.py")
    extra = touch(tmp_path / "other" / "extra.py")
    monkeypatch.chdir(tmp_path / "other")
    sections = (
        '[filters.pii]\npath = "filters/../filters/pii.py"\nenabled = false\non_error = "skip"\n'
        '[filters.unused]\npath = "filters/unused.py"\nenabled = false\n'
    )

    config = load(tmp_path, make(extra=sections), cli_filters=(str(pii), "./extra.py"))

    assert config.filters == (
        FilterConfig(id="pii", path=str(pii), enabled=True, on_error="skip"),
        FilterConfig(
            id="extra",
            path=str(extra),
            enabled=True,
            on_error="stop",
            config=(),
            from_section=False,
        ),
    )


def test_cli_filter_file_must_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    assert (
        load_error(tmp_path, make(), cli_filters=("./x.py",)) == "--filter ./x.py: file not found"
    )


def test_cli_filter_id_must_not_clash(tmp_path: Path) -> None:
    touch(tmp_path / "a" / "pii.py")
    other = touch(tmp_path / "b" / "pii.py")
    text = make(extra='[filters.pii]\npath = "a/pii.py"')

    message = load_error(tmp_path, text, cli_filters=(str(other),))

    assert message.startswith(f'--filter {other}: filter id "pii" is already used by')


def test_discover_alone_chooses_the_topics(tmp_path: Path) -> None:
    extra = '[discover]\ninclude = ["orders\\\\..*"]\nrename = "east.{topic}"\nstart = "END"'
    config = load(tmp_path, make(topics="", extra=extra))

    assert config.topics == ()
    assert config.discover.include == ("orders\\..*",)
    assert (config.discover.rename, config.discover.start) == ("east.{topic}", "end")


def test_replication_factor_zero_is_refused_but_minus_one_means_the_brokers(tmp_path: Path) -> None:
    config = load(tmp_path, make(target=f"{TARGET}\ncreate_topics = true\nreplication_factor = -1"))

    assert config.need_target().create_topics and config.need_target().replication_factor == -1
    assert "min.insync.replicas" in config.need_target().config_exclude
