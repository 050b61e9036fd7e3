"""What `ktm verify` prints and writes: one line per partition that is not exact, one summary
line, and with `--report` every partition as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from relay.pipelines.verify.spec import Finding, PartitionReport


def name(report: PartitionReport) -> str:
    dest = f"{report.dest[0]}[{report.dest[1]}]"
    if report.key is None:
        return f"{dest} (records naming no source of this config)"
    return f"{report.key[0]}[{report.key[1]}] -> {dest}"


def line(report: PartitionReport, scope: str = "") -> str:
    """`orders[1] -> copy[1]: 999 compared, 998 equal; missing 1 (first: source 500) ...`,
    with what was left unchecked (`scope`: --sample, the time window) and a store's breaks."""
    head = f"{name(report)}: {report.compared} compared, {report.equal} equal"
    notes = list(report.notes)
    if report.deleted:
        notes.append(
            f"{report.deleted} deleted at the source before they were copied (below "
            f"its log start, {report.start})"
        )
    if report.earlier:
        notes.append(f"{report.earlier} copies of an earlier incarnation, not compared")
    tail = "".join(f"; {note}" for note in notes) + (f" [{scope}]" if scope else "")
    if report.not_verified:
        return f"{head}; NOT VERIFIED: {report.not_verified}{tail}"
    if report.exact:
        return f"{head}: exact{tail}"
    first = {f.kind: f for f in report.first}
    faults = [f"{kind} {count} (first: {where(first[kind])})" for kind, count in report.counts]
    return f"{head}; " + "; ".join(faults) + tail


def summary(reports: Sequence[PartitionReport], scope: str = "") -> str:
    checked = [r for r in reports if r.key is not None]
    exact = sum(r.exact for r in checked)
    unverified = sum(bool(r.not_verified) for r in checked)
    differ = len(checked) - exact - unverified
    stray = sum(r.compared for r in reports if r.key is None)
    compared = sum(r.compared for r in reports)
    tail = f"; {stray} destination records name no source" if stray else ""
    deleted = sum(r.deleted for r in checked)
    tail += f"; {deleted} deleted at the source before they were copied" if deleted else ""
    earlier = sum(r.earlier for r in checked)
    tail += (
        f"; {earlier} copies of a recreated source topic's earlier incarnation, not compared"
        if earlier
        else ""
    )
    return (
        f"verify: {len(checked)} partitions, {exact} exact, {differ} differ, {unverified} not "
        f"verified; {compared} records compared{tail}" + (f" [{scope}]" if scope else "")
    )


def first_fault(reports: Sequence[PartitionReport]) -> str | None:
    """One line naming the first partition that is not exact, or None when all are."""
    for report in reports:
        if report.not_verified:
            return f"{name(report)} was not verified: {report.not_verified}"
        if not report.exact:
            found = min(report.first, key=lambda f: (f.source_offset, f.dest_offset))
            return f"{name(report)} differs: {found.kind} at {where(found)}"
    return None


def write_json(
    path: Path,
    reports: Sequence[PartitionReport],
    scope: str = "",
    seconds: dict[str, float] | None = None,
) -> None:
    """Every partition's result; `seconds`: how long planning and Spark's start ("start")
    and the comparison ("passes") took."""
    doc = {
        "exact": first_fault(reports) is None,
        "seconds": seconds or {},
        "scope": scope or "everything",
        "summary": summary(reports, scope),
        "partitions": [_as_dict(r) for r in reports],
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")


def _as_dict(report: PartitionReport) -> dict[str, object]:
    key = report.key
    return {
        "source": None if key is None else {"topic": key[0], "partition": key[1]},
        "destination": {"topic": report.dest[0], "partition": report.dest[1]},
        "range": [report.start, report.end],
        "compared": report.compared,
        "equal": report.equal,
        "exact": report.exact,
        "not_verified": report.not_verified or None,
        "faults": {kind: count for kind, count in report.counts},
        "notes": list(report.notes),
        "deleted_at_source": report.deleted,
        "earlier": report.earlier,
        "first": {
            f.kind: {
                "source_offset": _none(f.source_offset),
                "destination_offset": _none(f.dest_offset),
                "segment": f.where or None,
            }
            for f in report.first
        },
    }


def where(finding: Finding) -> str:
    if finding.where:
        return f"source offset {finding.source_offset}, segment {finding.where}"
    if finding.dest_offset < 0:
        return f"source offset {finding.source_offset}"
    if finding.source_offset < 0:
        return f"destination offset {finding.dest_offset}"
    return f"source offset {finding.source_offset}, destination offset {finding.dest_offset}"


def _none(offset: int) -> int | None:
    return None if offset < 0 else offset
