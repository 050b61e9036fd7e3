"""The contenders and how to start them: ktm (a generated config, --summary-json, /metrics) and
the baseline loops of scripts/bench/loops.py (naive kafka-python, optional confluent-kafka)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from scripts.bench.data import Brokers
from scripts.bench.processes import Launched
from testbed.ports import free_port

CONTENDERS = ("ktm", "naive", "confluent", "tuned")
LABELS = {
    "ktm": "ktm",
    "naive": "naive kafka-python loop",
    "confluent": "confluent-kafka loop",
    "tuned": "confluent-kafka loop, latency-tuned",
    "ktm-first": "ktm, first run on a machine",
}
NEEDS_CONFLUENT = ("confluent", "tuned")
PRODUCED = "ktm_messages_produced_total"
SCRAPE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Bench:
    """Where contenders run: the brokers, the work directory (configs, logs) and ktm's extra
    config lines (--ktm-set), which every generated config gets."""

    cluster: Brokers
    workdir: Path
    ktm_settings: tuple[str, ...] = ()
    loop_flush_interval: float = 0.0  # the confluent loop flushes every batch unless > 0


def unique(what: str) -> str:
    """A name for a run's files, group and topics that no earlier run used."""
    return f"{what}-{uuid.uuid4().hex[:6]}"


def ktm_executable() -> str:
    """The ktm next to this interpreter (the venv ktm is installed in), else the one on PATH."""
    beside = Path(sys.executable).parent / "ktm"
    found = str(beside) if beside.exists() else shutil.which("ktm")
    if not found:
        raise SystemExit(f"no ktm next to {sys.executable} nor on PATH: activate ktm's venv")
    return found


def ktm_version() -> str:
    """`ktm --version` and where it imports relay from (PYTHONPATH can point elsewhere)."""
    code = "import relay; print(relay.__file__)"
    exe = ktm_executable()
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
        where = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{exe}: {exc!r}"
    said = version.stdout.strip() or version.stderr.strip()
    return f"{said} ({exe}; relay imported from {where.stdout.strip()})"


def has_confluent() -> bool:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return False
    return True


def runnable(kinds: tuple[str, ...]) -> tuple[str, ...]:
    """The chosen contenders that can run here (the confluent loops only if it is installed)."""
    return tuple(k for k in kinds if k not in NEEDS_CONFLUENT or has_confluent())


def settings_by_section(settings: tuple[str, ...]) -> dict[str, list[str]]:
    """'spark.slots=4' -> {'spark': ['slots = 4']}; values are TOML, as the user wrote them."""
    sections: dict[str, list[str]] = {"app": [], "spark": [], "target": []}
    for item in settings:
        path, _, value = item.partition("=")
        section, _, key = path.strip().rpartition(".")
        sections.setdefault(section, []).append(f"{key} = {value.strip()}")
    return sections


def servers(bootstrap: str) -> str:
    """A TOML list of a bootstrap's addresses: "h:1,h:2" -> ["h:1", "h:2"]."""
    return json.dumps([address.strip() for address in bootstrap.split(",")])


def ktm_config(
    bench: Bench, routes: dict[str, str], metrics_port: int, discover: str | None = None
) -> str:
    sections = settings_by_section(bench.ktm_settings)
    sections["app"] = [
        f'metrics_addr = "127.0.0.1:{metrics_port}"',
        f'group_id = "{unique("bench")}"',
        *sections["app"],
    ]
    sections["target"] = [f"servers = {servers(bench.cluster.dst)}", *sections["target"]]
    lines = ["[topics]\n" + "".join(f'"{s}" = "{t}"\n' for s, t in routes.items())]
    if discover is not None:  # the topics a pattern matches, copies under the same names
        lines.append(f"[discover]\ninclude = [{json.dumps(discover)}]\n")
        sections["target"].append("create_topics = true")
    lines.append(f'[[sources]]\nname = "bench-source"\nservers = {servers(bench.cluster.src)}\n')
    for section, body in sections.items():
        if body:
            lines.append(f"[{section}]\n" + "\n".join(body) + "\n")
    return "\n".join(lines)


class Ktm(Launched):
    """`ktm relay` on ``source`` -> ``target``, with /metrics on a free port and a summary."""

    def __init__(
        self,
        bench: Bench,
        source: str,
        target: str,
        *,
        stop_at_end: bool,
        routes: dict[str, str] | None = None,  # many topics: source -> destination
        discover: str | None = None,  # a [discover] pattern instead of routes
    ):
        name = unique("ktm")
        port = free_port()  # a tiny race with other programs; ktm says so if it loses it
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        config = bench.workdir / f"{name}.toml"
        routes = {} if discover is not None else routes or {source: target}
        config.write_text(ktm_config(bench, routes, port, discover))
        self.summary_path = bench.workdir / f"{name}.summary.json"
        cmd = [ktm_executable(), "relay", "--config", str(config), "--no-progress"]
        cmd += ["--summary-json", str(self.summary_path)]
        cmd += ["--stop-at-end"] if stop_at_end else []
        # KTM_LOG_DIR: Spark's log lands with the benchmark's other logs, not in /tmp/ktm
        super().__init__(name, cmd, bench.workdir, env={"KTM_LOG_DIR": str(bench.workdir)})

    def summary(self) -> dict[str, Any] | None:
        """The --summary-json ktm wrote at exit, None if it wrote none."""
        try:
            return dict(json.loads(self.summary_path.read_text()))
        except (OSError, ValueError):
            return None

    def produced(self) -> int | None:
        """Summed ktm_messages_produced_total (records acknowledged); None if /metrics does not
        answer (yet)."""
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=SCRAPE_TIMEOUT_S) as answer:
                text = answer.read().decode()
        except (OSError, urllib.error.URLError):
            return None
        try:
            families = list(text_string_to_metric_families(text))
        except ValueError:  # a half-written answer while ktm shuts down
            return None
        return int(
            sum(s.value for family in families for s in family.samples if s.name == PRODUCED)
        )


class FirstKtm(Ktm):
    """ktm as on a machine's first run: an empty class cache, so it writes Spark's class
    archive at exit. The cache (~70 MB) is removed once the run is reaped."""

    def __init__(self, bench: Bench, source: str, target: str, *, stop_at_end: bool):
        self.cache = Path(tempfile.mkdtemp(prefix="class-cache-", dir=bench.workdir))
        settings = (*bench.ktm_settings, f"spark.class_cache={json.dumps(str(self.cache))}")
        first = dataclasses.replace(bench, ktm_settings=settings)
        super().__init__(first, source, target, stop_at_end=stop_at_end)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        shutil.rmtree(self.cache, ignore_errors=True)


class Loop(Launched):
    """A baseline loop (scripts/bench/loops.py) from ``source`` to ``target``."""

    def __init__(
        self,
        kind: str,
        bench: Bench,
        topics: tuple[str, str],
        partitions: int,
        *,
        follow: bool,
        pairs: Path | None = None,  # many topics: a JSON file of [source, target, partitions]
    ):
        cmd = [sys.executable, "-m", "scripts.bench.loops", kind]
        cmd += ["--src", bench.cluster.src, "--dst", bench.cluster.dst]
        if pairs is not None:
            cmd += ["--pairs", str(pairs)]
        else:
            cmd += ["--source", topics[0], "--target", topics[1], "--partitions", str(partitions)]
        cmd += ["--group", unique(f"bench-{kind}")] + (["--follow"] if follow else [])
        if bench.loop_flush_interval > 0:
            cmd += ["--flush-interval", str(bench.loop_flush_interval)]
        super().__init__(unique(kind), cmd, bench.workdir)


def launch(
    kind: str, bench: Bench, topics: tuple[str, str], partitions: int, *, continuous: bool
) -> Ktm | Loop:
    """Start a contender. continuous=False: copy what is there and exit; True: follow the
    topic until SIGTERM."""
    if kind == "ktm":
        return Ktm(bench, *topics, stop_at_end=not continuous)
    if kind == "ktm-first":
        return FirstKtm(bench, *topics, stop_at_end=not continuous)
    return Loop(kind, bench, topics, partitions, follow=continuous)
