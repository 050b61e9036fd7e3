"""The `ktm` command line through click's CliRunner: help, version, and usage/config errors.

No broker and no Spark: every case here fails (or finishes) before a relay would start.
"""

from __future__ import annotations

import logging
import platform
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from relay import __version__
from relay.cli import main

SOURCE = '[[sources]]\nname = "local"\nservers = ["127.0.0.1:1"]\n'
TARGET = '[target]\nservers = ["127.0.0.1:2"]\n'
TOPICS = '[topics]\n"demo" = "demo-copy"\n'
VALID = TOPICS + SOURCE + TARGET
PASSWORD = "hunter2-never-printed"


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """`ktm relay` installs a stderr handler on the root logger (CliRunner's stream, closed
    after the call) and sets levels: undo that so later tests log normally."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    noisy = {name: logging.getLogger(name).level for name in ("kafka", "py4j", "pyspark")}
    yield
    root.handlers[:], root.level = saved[0], saved[1]
    for name, level in noisy.items():
        logging.getLogger(name).setLevel(level)


def ktm(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), prog_name="ktm")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def assert_config_error(result: Result, *mentions: str) -> str:
    """Exit 2, nothing on stdout, one `ktm: error:` line on stderr naming ``mentions``."""
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ktm: error: ")
    for mention in mentions:
        assert mention in lines[0]
    return lines[0]


def test_help_lists_the_relay_command() -> None:
    result = ktm("--help")
    assert result.exit_code == 0
    assert result.output.startswith("Usage: ktm ")
    assert "relay" in result.output
    assert ktm("-h").output == result.output


def test_version_names_what_a_bug_report_needs() -> None:
    result = ktm("--version")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0] == f"ktm {__version__}"
    assert [line.split()[0] for line in lines[1:]] == ["Python", "PySpark", "kafka-python", "Java"]
    assert lines[1].startswith(f"Python {platform.python_version()} ")
    assert lines[2] == f"PySpark {metadata.version('pyspark')}"
    assert lines[3] == f"kafka-python {metadata.version('kafka-python')}"


def test_version_says_when_java_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))  # no bin/java there
    lines = ktm("--version").output.splitlines()
    assert lines[-1].startswith("Java not found (PySpark needs Java 17")


def test_relay_help_lists_every_option_with_its_default() -> None:
    result = ktm("relay", "--help")
    assert result.exit_code == 0
    for option in ("--config", "--mode", "--stop-at-end", "--filter", "--master", "--debug"):
        assert option in result.output
    assert "[default: config.toml]" in result.output
    assert "[default: single]" in result.output


def test_help_imports_neither_spark_nor_kafka() -> None:
    """`ktm --help` stays fast: pyspark and kafka-python load only when a relay starts."""
    code = (
        "import sys\nfrom relay.cli import main\n"
        "try:\n    main(['relay', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pyspark', 'kafka', 'py4j'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    ("text", "mentions"),
    [
        pytest.param(
            VALID + "max_retrys = 3\n",
            ("[target].max_retrys", "unknown key", "max_retries"),
            id="unknown-key",
        ),
        pytest.param(
            VALID + 'max_retries = "x"\n',
            ("[target].max_retries", '"x"'),
            id="bad-value",
        ),
        pytest.param(
            VALID + '[spark]\nrebalance_interval = "fast"\n',
            ("[spark].rebalance_interval", '"fast"'),
            id="bad-duration",
        ),
        pytest.param(VALID + "[taget]\nx = 1\n", ("taget", "unknown key"), id="unknown-section"),
        pytest.param(TOPICS + SOURCE, ("[target]", "missing"), id="missing-section"),
        pytest.param(
            TOPICS + '[[sources]]\nname = "local"\n' + TARGET,
            ("[[sources]][1].servers", "missing"),
            id="missing-key",
        ),
        pytest.param(VALID + "[app\n", ("config.toml", "invalid TOML", "line"), id="bad-toml"),
    ],
)
def test_config_error_exits_2_with_one_line_naming_the_key(
    tmp_path: Path, text: str, mentions: tuple[str, ...]
) -> None:
    config = write(tmp_path, text)
    assert_config_error(ktm("relay", "--config", str(config), "--stop-at-end"), *mentions)


def test_secret_in_a_bad_key_is_not_shown(tmp_path: Path) -> None:
    config = write(tmp_path, VALID.replace(SOURCE, SOURCE + f'password = "{PASSWORD}"\n'))
    line = assert_config_error(ktm("relay", "--config", str(config)), "[[sources]][1].password")
    assert PASSWORD not in line


def test_debug_dumps_the_config_without_secrets_and_still_one_error_line(tmp_path: Path) -> None:
    """A filter that breaks its contract fails after --debug has logged the whole config."""
    broken = tmp_path / "broken.py"
    broken.write_text("x = 1\n")  # no new(config)
    sasl = f'sasl_mechanism = "PLAIN"\nusername = "u"\npassword = "{PASSWORD}"\n'
    config = write(tmp_path, TOPICS + SOURCE + sasl + TARGET)

    result = ktm("relay", "--config", str(config), "--filter", str(broken), "--debug")

    assert result.exit_code == 2, result.output
    assert "config:" in result.stderr  # the dump is there...
    assert PASSWORD not in result.output  # ...without the password
    errors = [line for line in result.stderr.splitlines() if line.startswith("ktm: error: ")]
    assert len(errors) == 1 and "broken" in errors[0] and "new(config)" in errors[0]


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"
    assert_config_error(ktm("relay", "--config", str(missing)), str(missing), "file not found")


def test_default_config_file_is_config_toml_in_the_working_directory(tmp_path: Path) -> None:
    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path):
        result = runner.invoke(main, ["relay"], prog_name="ktm")
    assert_config_error(result, "config.toml", "file not found")


def test_config_directory_is_a_usage_error(tmp_path: Path) -> None:
    result = ktm("relay", "--config", str(tmp_path))
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_unknown_mode_is_a_usage_error(tmp_path: Path) -> None:
    result = ktm("relay", "--config", str(write(tmp_path, VALID)), "--mode", "double")
    assert result.exit_code == 2
    assert "double" in result.stderr
    assert "Traceback" not in result.output
