"""The driver JVM's class archive: when a start writes one, uses one, or neither."""

from __future__ import annotations

import os
import time
from pathlib import Path

from relay.engine import class_archive


def test_a_start_without_an_archive_asks_for_one_under_its_own_name(tmp_path: Path) -> None:
    plan = class_archive.plan(str(tmp_path / "cache"))
    assert plan.writing is not None and plan.final is not None
    assert plan.option == f"-XX:ArchiveClassesAtExit={plan.writing}"
    assert plan.writing.parent == plan.final.parent == tmp_path / "cache"
    assert str(os.getpid()) in plan.writing.name and not plan.final.exists()


def test_a_clean_exit_publishes_the_archive_and_the_next_start_uses_it(tmp_path: Path) -> None:
    plan = class_archive.plan(str(tmp_path))
    assert plan.writing is not None and plan.final is not None
    plan.writing.write_bytes(b"archive")
    class_archive.publish(plan, exited_cleanly=True)
    assert plan.final.read_bytes() == b"archive" and not plan.writing.exists()
    again = class_archive.plan(str(tmp_path))
    assert again == class_archive.ArchivePlan(f"-XX:SharedArchiveFile={plan.final}")


def test_a_killed_jvm_leaves_no_archive(tmp_path: Path) -> None:
    plan = class_archive.plan(str(tmp_path))
    assert plan.writing is not None and plan.final is not None
    plan.writing.write_bytes(b"half an archiv")
    class_archive.publish(plan, exited_cleanly=False)
    assert not plan.writing.exists() and not plan.final.exists()


def test_partial_archives_of_killed_runs_are_removed_once_stale(tmp_path: Path) -> None:
    old, fresh = tmp_path / "spark-driver-x.jsa.1.tmp", tmp_path / "spark-driver-x.jsa.2.tmp"
    old.write_bytes(b"x")
    fresh.write_bytes(b"x")
    long_ago = time.time() - class_archive.STALE_AFTER - 10
    os.utime(old, (long_ago, long_ago))
    class_archive.plan(str(tmp_path))
    assert not old.exists() and fresh.exists()  # another process may still be writing it


def test_an_empty_setting_turns_it_off(tmp_path: Path) -> None:
    assert class_archive.plan(None) == class_archive.ArchivePlan("")
    assert class_archive.plan("") == class_archive.ArchivePlan("")


def test_an_unwritable_directory_turns_it_off(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert class_archive.plan(str(blocker / "cache")) == class_archive.ArchivePlan("")
