"""deploy/'s rules and dashboard against a real Prometheus scraping real ktm processes.

Two `ktm relay` processes share a topic (one group) while a feeder writes; Prometheus scrapes
both every second with a copy of deploy/prometheus/ktm-rules.yml whose `for:` durations and
one-minute windows are shortened (nothing else changes). The target broker frozen with SIGSTOP
makes KtmPartitionStuck fire, SIGCONT resolves it; then every recording rule and every
dashboard panel returns series; one process killed makes KtmGroupMembersMissing (and KtmDown) fire.
The panels only other modes fill (failovers, backup segments, restore waits) are checked on a
failover-mode backup and a restore --follow.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed import prometheus
from testbed.ktm_process import Ktm
from testbed.ports import free_port
from testbed.prometheus import Prometheus
from testbed.records import Record, produce, read_all
from testbed.tansu import NO_KILL_REASON, TansuBroker, brokers_are_external
from testbed.topics import create_topic, unique_topic
from tests.support.feeder import Feeder
from tests.support.relay import FAST_GROUP, write_config

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(prometheus.missing(), reason=prometheus.MISSING_REASON),
    pytest.mark.skipif(brokers_are_external(), reason=NO_KILL_REASON),
]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PARTITIONS = 4
FOR = "3s"  # every alert's `for:` in the test copy of the rules
WINDOW = "[20s]"  # its one-minute windows ("stuck" = no move for the window): 20 scrapes
# Panels whose series exist only in another mode (failover switches, backup segments, restore
# --follow waits): a relay never creates them.
OTHER_MODES = ("ktm_failovers_total", "ktm_segments_written_total", "ktm_restore_waiting_seconds")
# The "Verify" row's: a verify follower exports them (its test checks them).
VERIFY_METRICS = ("ktm_verify_mismatches_total", "ktm_verified_next_offset",
                  "ktm_verified_records_total", "ktm_verify_age_seconds")  # fmt: skip


def fast_rules(path: Path) -> Path:
    """The shipped rules with only their `for:` durations and one-minute windows shortened."""
    spec = yaml.safe_load((DEPLOY / "prometheus" / "ktm-rules.yml").read_text())
    for group in spec["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = FOR
            rule["expr"] = rule["expr"].replace("[1m]", WINDOW)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def panel_queries(job: str, instances: str, topic: str) -> list[tuple[str, str]]:
    """(panel title, expression) for every target of every panel, variables substituted as
    Grafana would ($__rate_interval: 4 scrapes of 1s and then some)."""
    board = json.loads((DEPLOY / "grafana" / "ktm-dashboard.json").read_text())
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "15s").replace("$instance", instances)
            found.append((panel["title"], expr.replace("$job", job).replace("$topic", topic)))
    return found


def recording_rules() -> list[str]:
    spec = yaml.safe_load((DEPLOY / "prometheus" / "ktm-rules.yml").read_text())
    return [r["record"] for g in spec["groups"] for r in g["rules"] if "record" in r]


class Group:
    """Two ktm processes on one config (their own metrics ports), a feeder, a Prometheus."""

    def __init__(self, source: Any, target: TansuBroker, tmp_path: Path):
        self.source, self.target, self.tmp_path = source, target, tmp_path
        self.topic = create_topic(source.bootstrap, unique_topic("prom-src"), PARTITIONS)
        self.dest = create_topic(target.bootstrap, unique_topic("prom-dst"), PARTITIONS)
        self.group = unique_topic("prom-group")
        self.processes: dict[int, Ktm] = {}

    def start_ktm(self) -> int:
        port = free_port()
        config = write_config(
            self.tmp_path / f"c-{port}.toml",
            source=self.source.bootstrap,
            target=self.target.bootstrap,
            topics={self.topic: self.dest},
            app=f'metrics_addr = "127.0.0.1:{port}"\ngroup_id = "{self.group}"',
            extra='request_timeout = "2s"',
        )
        # Retry for ever: a frozen destination must make the relay stuck, not end it.
        config.write_text(config.read_text().replace("max_retries = 1", "max_retries = -1"))
        self.processes[port] = Ktm(self.tmp_path, "--config", str(config), "--no-progress")
        return port

    def instances(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.processes]

    def kill_all(self) -> None:
        for process in self.processes.values():
            process.kill()


@pytest.fixture
def group(broker_factory: Any, tmp_path: Path) -> Iterator[Group]:
    target = broker_factory("target")
    assert isinstance(target, TansuBroker)  # frozen with SIGSTOP below
    setup = Group(broker_factory("source"), target, tmp_path)
    try:
        yield setup
    finally:
        if target.pid is not None:
            os.kill(target.pid, signal.SIGCONT)  # whatever happened: the broker must stop
        setup.kill_all()


@pytest.fixture
def feeder(group: Group) -> Iterator[Feeder]:
    feeding = Feeder(group.source.bootstrap, group.topic, PARTITIONS, per_batch=20, pause=0.1)
    yield feeding
    feeding.stop()


def series_of(prom: Prometheus, expr: str) -> int:
    return len(prom.query(expr))


def has_series(prom: Prometheus, expr: str) -> Callable[[], bool]:
    return lambda: series_of(prom, expr) > 0


def wait_until_both_members_relay(prom: Prometheus, group: Group) -> None:
    try:
        prom.wait_for(
            lambda: series_of(prom, 'ktm_group_members{job="ktm"} == 2') == 2,
            120,
            "both processes in one group",
        )
        prom.wait_for(
            lambda: series_of(prom, "ktm:messages_produced:rate1m > 0") == 1,
            60,
            "records relayed",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; ktm stderr:\n{_stderr(group)}") from None


def _stderr(group: Group) -> str:
    return "\n".join(process.stderr()[-2000:] for process in group.processes.values())


def assert_every_panel_and_rule_has_series(prom: Prometheus, group: Group) -> None:
    instances = "|".join(group.instances()).replace(".", "\\\\.")
    for title, expr in panel_queries("ktm", instances, group.topic):
        if any(metric in expr for metric in OTHER_MODES + VERIFY_METRICS):
            continue
        prom.wait_for(has_series(prom, expr), 30, f"{title!r}: {expr} has series")
    for record in recording_rules():
        prom.wait_for(has_series(prom, record), 30, f"{record} has series")


def freeze_target_until_stuck_fires(prom: Prometheus, group: Group) -> None:
    """SIGSTOP: the destination accepts connections and never answers. Nothing is
    acknowledged, the source keeps growing: lag > 0 and no progress for the rules' 1m window."""
    pid = group.target.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        prom.wait_for(
            lambda: len(prom.alerts("KtmPartitionStuck", "firing")) > 0, 150, "stuck fires"
        )
        stuck = prom.alerts("KtmPartitionStuck", "firing")
        assert {a["labels"]["source_topic"] for a in stuck} == {group.topic}
        # what the operator sees meanwhile: the retries and errors panels get series. Waited
        # for, not asserted at once: under load the alert can fire within seconds of the freeze
        # (a partition whose offsets have only just appeared has no "changes" yet), before the
        # first delivery times out. Which side fails first depends on timing (the target is also
        # the group's coordinator, so the tasks may lose their lease before a delivery times out).
        prom.wait_for(has_series(prom, "ktm_retries_total"), 90, "a retry while frozen")
        errors = 'ktm_errors_total{kind=~"target|channel"}'
        prom.wait_for(has_series(prom, errors), 90, "an error while frozen")
    finally:
        os.kill(pid, signal.SIGCONT)


def test_the_shipped_rules_and_dashboard_work_on_a_live_group(
    group: Group, feeder: Feeder, tmp_path: Path
) -> None:
    ports = [group.start_ktm(), group.start_ktm()]
    config = prometheus.scrape_config(group.instances(), [fast_rules(tmp_path / "rules.yml")])
    prom = Prometheus(tmp_path / "prometheus", config)
    try:
        wait_until_both_members_relay(prom, group)
        freeze_target_until_stuck_fires(prom, group)
        prom.wait_for(lambda: not prom.alerts("KtmPartitionStuck"), 90, "stuck resolves")
        moving = f'ktm:partition_messages_produced:increase1m{{source_topic="{group.topic}"}} > 0'
        # It resolves at the first move of the next offsets (a resync after the thaw finds
        # records that landed before the freeze); acknowledged records follow.
        prom.wait_for(has_series(prom, moving), 60, "records relayed again")
        assert_every_panel_and_rule_has_series(prom, group)

        group.processes[ports[0]].kill()
        prom.wait_for(
            lambda: len(prom.alerts("KtmGroupMembersMissing", "firing")) == 1,
            60,
            "the members alert fires",
        )
        prom.wait_for(lambda: bool(prom.alerts("KtmDown", "firing")), 30, "KtmDown fires")
        down = prom.alerts("KtmDown", "firing")
        assert [a["labels"]["instance"] for a in down] == [f"127.0.0.1:{ports[0]}"]
        assert group.processes[ports[1]].proc.poll() is None, _stderr(group)
    finally:
        prom.stop()


# --- the panels of the other modes ---------------------------------------------------------------

STORE_KEYS = 'max_segment_records = 500\nmax_segment_age = "1s"\nfollow_interval = "300ms"'
LAG_THRESHOLD = 100  # [source_pool].offset_lag_threshold: a node this far ahead takes over


def same_records(start: int, count: int) -> list[Record]:
    """Deterministic records, all in partition 0 (partition 1 stays empty): two nodes fed the
    same range hold the same data, as failover mode requires."""
    return [
        Record(key=b"k%d" % i, value=b"%08d" % i, partition=0, timestamp_ms=1_700_000_000_000 + i)
        for i in range(start, start + count)
    ]


def other_modes_configs(
    tmp_path: Path, nodes: list[Any], target: Any, topic: str
) -> list[tuple[Path, int]]:
    """The configs of a failover-mode backup of ``topic`` from ``nodes`` into a directory and
    of a restore of that directory into ``target``, with their metrics ports."""
    sources = "".join(
        f'[[sources]]\nname = "{n.name}"\nservers = ["{n.bootstrap}"]\n' for n in nodes
    )
    store = f'[store]\nurl = "{tmp_path / "store"}"\ncluster = "nodes"\n{STORE_KEYS}\n'
    pool = (
        f'[source_pool]\nhealthcheck_interval = "500ms"\nrequest_timeout = "500ms"\n'
        f"offset_lag_threshold = {LAG_THRESHOLD}\n"
    )
    paths = []
    for name, side in (
        ("backup", sources + pool),
        ("restore", f'[target]\nservers = ["{target.bootstrap}"]\n'),
    ):
        port = free_port()
        path = tmp_path / f"{name}-{port}.toml"
        path.write_text(
            f'[app]\nmetrics_addr = "127.0.0.1:{port}"\n{FAST_GROUP}\n\n'
            f'[topics]\n"{topic}" = "{topic}-restored"\n\n{side}\n{store}'
        )
        paths.append((path, port))
    return paths


def test_the_failover_backup_and_restore_panels_have_series(
    broker_factory: Any, tmp_path: Path
) -> None:
    nodes = [broker_factory("node1"), broker_factory("node2")]
    target = broker_factory("target")
    topic = unique_topic("prom-modes")
    for node in nodes:
        create_topic(node.bootstrap, topic, 2)
        produce(node.bootstrap, topic, same_records(0, 50))
    (backup_conf, backup_port), (restore_conf, restore_port) = other_modes_configs(
        tmp_path, nodes, target, topic
    )
    targets = [f"127.0.0.1:{backup_port}", f"127.0.0.1:{restore_port}"]
    prom = Prometheus(tmp_path / "prometheus", prometheus.scrape_config(targets))
    flags = ("--no-progress",)
    try:
        with (
            Ktm(tmp_path, "--config", str(backup_conf), "--mode", "failover", *flags,
                command="backup"),
            Ktm(tmp_path, "--config", str(restore_conf), "--follow", "--create-topics", *flags,
                command="restore"),
        ):  # fmt: skip
            prom.wait_for(has_series(prom, "ktm_segments_written_total"), 120, "a segment")
            # node1 falls behind node2 by more than the threshold: failover mode leaves it
            produce(nodes[1].bootstrap, topic, same_records(50, 3 * LAG_THRESHOLD))
            prom.wait_for(has_series(prom, 'ktm_failovers_total{reason="lag"}'), 60, "a failover")
            # partition 1 never gets a record, so a restore following the store waits for it
            waiting = 'ktm_restore_waiting_seconds{reason="empty", source_partition="1"} > 0'
            prom.wait_for(has_series(prom, waiting), 60, "the restore waiting")
            for title, expr in panel_queries("ktm", ".*", topic):
                if any(metric in expr for metric in OTHER_MODES):
                    prom.wait_for(has_series(prom, expr), 30, f"{title!r}: {expr} has series")
    finally:
        prom.stop()


# --- ktm verify --follow ------------------------------------------------------------------------


def test_a_fault_behind_a_running_relay_fires_the_copy_mismatch_alert(
    source_broker: Any, target_broker: Any, tmp_path: Path
) -> None:
    """A relay and `ktm verify --follow` beside it, both scraped; a record written twice into
    the destination behind the relay's back fires KtmCopyMismatch for that partition."""
    topic = create_topic(source_broker.bootstrap, unique_topic("prom-vf"), 2)
    dest = create_topic(target_broker.bootstrap, unique_topic("prom-vf-dst"), 2)
    relay_port, verify_port = free_port(), free_port()
    config = write_config(tmp_path / "c.toml", source=source_broker.bootstrap,
                          target=target_broker.bootstrap, topics={topic: dest},
                          app=f'metrics_addr = "127.0.0.1:{relay_port}"',
                          extra=f'\n[verify]\ninterval = "300ms"\n'
                                f'metrics_addr = "127.0.0.1:{verify_port}"\n')  # fmt: skip
    feeding = Feeder(source_broker.bootstrap, topic, 2, per_batch=20, pause=0.1)
    targets = [f"127.0.0.1:{relay_port}", f"127.0.0.1:{verify_port}"]
    rules = fast_rules(tmp_path / "rules.yml")
    prom = Prometheus(tmp_path / "prometheus", prometheus.scrape_config(targets, [rules]))
    try:
        with (
            Ktm(tmp_path, "--config", str(config), "--no-progress") as relay,
            Ktm(tmp_path, "--config", str(config), "--follow", command="verify") as follower,
        ):
            verified = f'ktm_verified_next_offset{{source_topic="{topic}"}} > 100'
            prom.wait_for(lambda: series_of(prom, verified) == 2, 120, "both partitions verified")
            assert not prom.alerts("KtmCopyMismatch")
            third = read_all(source_broker.bootstrap, topic)[0][3]
            twice = Record(
                key=third.key,
                value=third.value,
                partition=0,
                timestamp_ms=third.timestamp,
                headers=[*third.headers, ("ktm.src", b"src/%s/0/3" % topic.encode())],
            )
            produce(target_broker.bootstrap, dest, [twice])
            prom.wait_for(lambda: bool(prom.alerts("KtmCopyMismatch", "firing")), 90, "it fires")
            (alert,) = prom.alerts("KtmCopyMismatch", "firing")
            labels = {k: alert["labels"][k] for k in ("source_topic", "source_partition", "kind")}
            assert labels == {"source_topic": topic, "source_partition": "0", "kind": "duplicated"}
            for title, expr in panel_queries("ktm", ".*", topic):  # the dashboard's Verify row
                if any(metric in expr for metric in VERIFY_METRICS):
                    prom.wait_for(has_series(prom, expr), 30, f"{title!r}: {expr} has series")
            feeding.stop()
            follower.proc.send_signal(signal.SIGTERM)
            assert follower.wait(60).returncode == 1  # it found something: not a clean bill
            assert relay.proc.poll() is None, relay.stderr()
    finally:
        feeding.stop()
        prom.stop()
