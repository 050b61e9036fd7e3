"""deploy/: the Prometheus rules and their promtool unit tests, the Grafana dashboard, the scrape
config and the systemd unit. No broker; promtool runs for real (skipped only when absent).

The metric names the rules and panels use are checked against what relay/engine/metrics.py
declares, so renaming a metric without its rules and panels fails here.
"""

from __future__ import annotations

import configparser
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from relay.engine.metrics import Metrics
from testbed import prometheus

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "ktm-rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "ktm-rules.test.yml"
SCRAPE = DEPLOY / "prometheus" / "scrape.yml"
DASHBOARD = DEPLOY / "grafana" / "ktm-dashboard.json"
UNIT = DEPLOY / "systemd" / "ktm.service"
ENV_EXAMPLE = DEPLOY / "systemd" / "ktm.env.example"
# Where every alert sends the operator: the troubleshooting table, a page of the docs.
TROUBLESHOOTING = "docs/troubleshooting.md"

needs_promtool = pytest.mark.skipif(prometheus.missing(), reason=prometheus.MISSING_REASON)

# Series Prometheus itself makes, per scraped target.
PROMETHEUS_SERIES = {"up"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def rules() -> list[dict[str, Any]]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panel_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def exported_names() -> set[str]:
    """Every series name ktm's /metrics can show (counters with _total, histograms' parts)."""
    names: set[str] = set()
    for family in Metrics(CollectorRegistry()).registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def metric_names(expr: str) -> set[str]:
    """Names of the series an expression selects: identifiers outside strings and label
    matchers that are not PromQL functions, keywords, or label names after by/on/without."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings may hold anything
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges: [1m], [$__rate_interval]
    found = set(re.findall(r"(?<![\w:.])[A-Za-z_:][\w:]*(?![\w:]|\s*\()", text))
    keywords = {"and", "or", "unless", "offset", "bool", "le"}
    return {name for name in found if name not in keywords and not name.isdigit()}


@needs_promtool
def test_the_rules_pass_promtool_check() -> None:
    checked = prometheus.promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_promtool
def test_the_rules_pass_their_promtool_unit_tests() -> None:
    tested = prometheus.promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test_where_it_fires_and_one_where_it_does_not() -> None:
    cases = [
        case
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    for alert in alerts():
        mine = [case for case in cases if case["alertname"] == alert["alert"]]
        assert any(case["exp_alerts"] for case in mine), f"{alert['alert']} never fires"
        assert any(not case["exp_alerts"] for case in mine), f"{alert['alert']} always fires"


def test_the_troubleshooting_table_the_alerts_link_exists() -> None:
    page = DEPLOY.parent / TROUBLESHOOTING
    assert page.is_file(), f"the alerts link {TROUBLESHOOTING}, which does not exist"
    assert "| symptom | exit | what to do |" in page.read_text()


def test_every_alert_says_what_to_do_and_links_the_troubleshooting_table() -> None:
    names = [alert["alert"] for alert in alerts()]
    assert len(names) == len(set(names)), names
    for alert in alerts():
        notes = alert.get("annotations", {})
        assert notes.get("summary"), alert["alert"]
        assert TROUBLESHOOTING in notes.get("description", ""), alert["alert"]
        assert alert.get("labels", {}).get("severity") in {"critical", "warning", "info"}


def test_the_rules_cover_every_failure_the_operator_must_hear_about() -> None:
    used = " ".join(alert["expr"] for alert in alerts())
    for metric in (
        "up",
        "ktm_partition_lag",
        "ktm_replication_latency_seconds_bucket",
        "ktm_source_node_up",
        "ktm_failovers_total",
        "ktm_errors_total",
        "ktm_retries_total",
        "ktm_produce_retries_total",
        "ktm_group_members",
        "ktm_segments_written_total",
        "ktm_restore_waiting_seconds",
        "ktm_partitions_halted",
        "ktm_source_records_lost_total",
    ):
        assert metric in used or any(
            metric in rule["expr"] and rule["record"] in used
            for rule in rules()
            if "record" in rule
        ), f"no alert watches {metric}"


def test_recording_rules_are_named_level_metric_operation() -> None:
    for rule in rules():
        if "record" in rule:
            assert re.fullmatch(r"ktm:[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]


def test_every_metric_a_rule_or_a_panel_uses_is_exported_by_ktm() -> None:
    defined = exported_names() | PROMETHEUS_SERIES
    defined |= {rule["record"] for rule in rules() if "record" in rule}
    exprs = [rule["expr"] for rule in rules()] + panel_exprs()
    assert len(exprs) > 20
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric found in {expr!r}"
        assert names <= defined, (
            f"{expr!r} uses {sorted(names - defined)}, which ktm does not export"
        )


def test_metric_names_finds_what_an_expression_selects() -> None:
    expr = 'sum by (le, job) (rate(ktm_x_bucket{le="1", a=~"b|c"}[$__rate_interval])) > on (job) up'
    assert metric_names(expr) == {"ktm_x_bucket", "up"}
    assert metric_names("ktm:a:b > 0 unless on (x) (changes(ktm_y[1m]) > 0)") == {
        "ktm:a:b",
        "ktm_y",
    }


def test_the_dashboard_has_its_data_source_input_and_variables() -> None:
    board = dashboard()
    assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
    assert board["__inputs"][0]["pluginId"] == "prometheus"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"job", "instance", "topic"}
    for variable in variables.values():
        assert variable["datasource"]["uid"] == "${DS_PROMETHEUS}"
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    for panel in panels:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert "$job" in target["expr"], f"{panel['title']}: {target['expr']}"


def test_the_dashboard_shows_what_an_operator_watches() -> None:
    exprs = " ".join(panel_exprs())
    for metric in (
        "ktm:messages_consumed:rate1m",
        "ktm:messages_produced:rate1m",
        "ktm:partition_lag:min",
        "ktm:replication_latency_seconds:p50_5m",
        "ktm:replication_latency_seconds:p99_5m",
        "ktm_active_node",
        "ktm_failovers_total",
        "ktm_rounds_total",
        "ktm_group_members",
        "ktm_assigned_partitions",
        "ktm_errors_total",
        "ktm_retries_total",
        "ktm_produce_retries_total",
        "ktm_segments_written_total",
        "ktm_bytes_produced_total",
        "ktm_restore_waiting_seconds",
    ):
        assert metric in exprs, f"no panel shows {metric}"


@needs_promtool
def test_the_example_scrape_config_passes_promtool_and_names_its_jobs_ktm() -> None:
    checked = prometheus.promtool("check", "config", SCRAPE.name, cwd=SCRAPE.parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    jobs = [job["job_name"] for job in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]]
    assert jobs and all(job.startswith("ktm") for job in jobs)  # what the rules select


def systemd_seconds(value: str) -> float:
    units = {"ms": 0.001, "s": 1, "min": 60, "m": 60}
    number, unit = re.fullmatch(r"(\d+)\s*(ms|s|min|m)?", value).groups()  # type: ignore[union-attr]
    return int(number) * units[unit or "s"]


def test_the_systemd_unit_stops_with_sigterm_in_time_and_restarts_on_failure() -> None:
    from relay.engine.driver.rounds import DRAIN_LIMIT
    from relay.engine.spark import JVM_EXIT_TIMEOUT

    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are CamelCase
    unit.read_string(UNIT.read_text())
    service = unit["Service"]
    assert service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] in {"mixed", "control-group"}
    # ktm's own stop: draining tasks get DRAIN_LIMIT to stop, then the JVM JVM_EXIT_TIMEOUT.
    assert systemd_seconds(service["TimeoutStopSec"]) > DRAIN_LIMIT + JVM_EXIT_TIMEOUT
    assert service["Restart"] == "on-failure"
    assert re.search(r"\bktm relay --config /\S+\.toml\b", service["ExecStart"])
    assert service["EnvironmentFile"].startswith("/")
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_the_environment_example_holds_the_secrets_the_sample_config_names() -> None:
    sample = (DEPLOY.parent / "config.sample.toml").read_text()
    named = set(re.findall(r"\$\{(KTM_[A-Z_]+)\}", sample))
    assigned = set(re.findall(r"^(\w+)=", ENV_EXAMPLE.read_text(), re.MULTILINE))
    assert named and named <= assigned
