"""Log set-up: JSON lines for log shippers, and what reaches the operator's terminal."""

from __future__ import annotations

import json
import logging
import re

from relay.logs import setup_logging


def test_json_format_writes_one_object_per_line(capsys) -> None:
    setup_logging("info", fmt="json")
    logging.getLogger("relay.engine.driver").info("round %d: %d records", 3, 500)
    line = capsys.readouterr().err.strip()
    entry = json.loads(line)
    assert entry["level"] == "info" and entry["logger"] == "relay.engine.driver"
    assert entry["msg"] == "round 3: 500 records"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}", entry["ts"])


def test_library_noise_stays_out_unless_debug(capsys) -> None:
    setup_logging("info")
    logging.info("py4j-style root message")  # py4j logs tracebacks on the root logger
    logging.getLogger("kafka.conn").error("reconnect storm")
    logging.getLogger("pyspark.x").warning("a library warning")
    logging.getLogger("relay.task").info("ours")
    err = capsys.readouterr().err
    assert "ours" in err and "a library warning" not in err  # pyspark is muted below CRITICAL
    assert "root message" not in err and "reconnect storm" not in err
    setup_logging("info", debug=True)
    logging.info("py4j-style root message")
    assert "root message" in capsys.readouterr().err
