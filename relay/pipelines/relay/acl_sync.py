"""Topic ACLs copied from the source to the destination topics while relaying (`[acls]`), as
MirrorMaker 2 copies them, every `[acls].interval`.

The rules:
- Only ACLs on topics (literal and prefixed patterns) whose principal `[acls].principals`
  takes ([] = all) and `[acls].exclude` does not.
- ALLOW: READ and DESCRIBE are copied, ALL becomes READ (which lets DESCRIBE too), every other
  operation (WRITE, ALTER, DELETE, ...) is left out: the copies are written by ktm alone.
- DENY (MirrorMaker 2 leaves them out): copied as well, READ and DESCRIBE as they are, ALL as
  READ and DESCRIBE, because an ALLOW on a prefix copied without the DENY that narrows it
  would grant on the target what the source refuses.
- A literal ACL is copied for each destination of the topic it names, when ktm relays that
  topic (`[topics]` and `[discover].rename` followed); others (and the literal "*") are not.
- A prefixed ACL is copied when ktm relays a topic that begins with its prefix: as the renamed
  prefix when `[discover].rename` keeps prefixes ("{topic}", "east.{topic}": no text after
  "{topic}") and the destinations of those topics carry it; every other destination under it
  gets a literal ACL of its own.
- ktm never deletes an ACL (MirrorMaker 2 does not either): an ACL removed on the source stays
  on the target until an operator removes it, because ktm cannot tell one it copied from one
  an operator created, and a permission taken away by surprise stops a consumer.
- A principal that is a SCRAM user on the source but not on the target is named once (a
  consumer moved over could not log in); other principals (certificates, Kerberos, OAuth)
  live outside Kafka, so they cannot be checked.
- An ACL the target refuses is named once and not asked for again while the process runs.
- One process of a group of ktm processes syncs: the one the group sync would use.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from relay.clients import acls
from relay.clients.acls import TopicAcl
from relay.clients.admin import Unsupported
from relay.config import ClusterConfig, Config
from relay.engine.metrics import Metrics
from relay.pipelines.relay.relayed import Relayed
from relay.selection import matches

log = logging.getLogger(__name__)

ALLOWED = {"READ": ("READ",), "DESCRIBE": ("DESCRIBE",), "ALL": ("READ",)}
DENIED = {"READ": ("READ",), "DESCRIBE": ("DESCRIBE",), "ALL": ("READ", "DESCRIBE")}
LOG_EACH_CREATED = 10  # more created ACLs than this: one line, each at debug

Route = tuple[str, str]  # (source topic, destination topic)


@dataclass(frozen=True)
class AclPlan:
    create: tuple[tuple[TopicAcl, TopicAcl], ...]  # (source ACL, destination ACL) missing
    present: int  # destination ACLs wanted that the target has already
    unknown_principals: tuple[str, ...]  # SCRAM users on the source, not on the target
    unavailable: str = ""  # why no ACL can be copied (a cluster without an authorizer)


def copied_acls(
    found: Iterable[TopicAcl],
    routes: Iterable[Route],
    rename: str,
    principals: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> dict[TopicAcl, TopicAcl]:
    """Each destination ACL the source's `found` ACLs call for, with the source ACL it copies
    (the first, where several call for the same)."""
    routes = sorted(set(routes))
    wanted: dict[TopicAcl, TopicAcl] = {}
    for acl in sorted(found):
        if not matches(list(principals) or [".*"], exclude, acl.principal):
            continue
        operations = (ALLOWED if acl.permission == "ALLOW" else DENIED).get(acl.operation, ())
        for pattern, name in destinations(acl, routes, rename):
            for operation in operations:
                copy = replace(acl, pattern=pattern, name=name, operation=operation)
                wanted.setdefault(copy, acl)
    return wanted


def destinations(acl: TopicAcl, routes: Sequence[Route], rename: str) -> list[tuple[str, str]]:
    """(pattern, name) of the destination resources a source ACL stands for."""
    if acl.pattern == "LITERAL":
        return [("LITERAL", dest) for src, dest in routes if src == acl.name]
    under = [(src, dest) for src, dest in routes if src.startswith(acl.name)]
    prefix, _, suffix = rename.partition("{topic}")
    renamed = prefix + acl.name
    keeps = not suffix and any(dest == prefix + src for src, dest in under)
    found = [("PREFIXED", renamed)] if keeps else []
    found += [("LITERAL", dest) for _, dest in under if not (keeps and dest.startswith(renamed))]
    return sorted(set(found))


class AclSync:
    def __init__(
        self,
        cfg: Config,
        relayed: Relayed,
        metrics: Metrics,
    ):
        self.cfg, self.metrics = cfg, metrics
        self.target = cfg.need_target().cluster
        self.timeout = cfg.need_target().request_timeout
        self.relayed = relayed
        self._said: set[str] = set()  # log lines written once
        self._refused: set[TopicAcl] = set()  # not asked for again while this process runs
        self._scram = True  # False once a cluster did not say its SCRAM users: not asked again

    def plan(self) -> AclPlan:
        """The ACLs the target lacks, read from both clusters now."""
        source = self.relayed.source
        cfg = self.cfg.acls
        try:
            on_source = acls.topic_acls(source, self.timeout)
            have = set(acls.topic_acls(self.target, self.timeout))
        except (acls.AclsUnavailable, Unsupported) as exc:
            return AclPlan((), 0, (), unavailable=str(exc))
        wanted = copied_acls(
            on_source,
            self.relayed.topic_pairs(),
            self.cfg.discover.rename,
            cfg.principals,
            cfg.exclude,
        )
        create = tuple((acl, copy) for copy, acl in sorted(wanted.items()) if copy not in have)
        principals = {copy.principal for copy in wanted}
        return AclPlan(create, len(wanted) - len(create), self._unknown(source, principals))

    def _unknown(self, source: ClusterConfig, principals: set[str]) -> tuple[str, ...]:
        users = {p.removeprefix("User:") for p in principals if p.startswith("User:")}
        users.discard("*")
        if not users or not self._scram:
            return ()
        try:
            on_source = acls.scram_users(source, self.timeout) & users
            missing = on_source and on_source - acls.scram_users(self.target, self.timeout)
        except Exception as exc:  # noqa: BLE001 - a check: the ACLs are copied all the same
            log.debug("SCRAM users cannot be compared (not asked again): %s", exc)
            self._scram = False  # Tansu lets it time out: every sync would wait that long
            return ()
        return tuple(f"User:{user}" for user in sorted(missing))

    def sync_once(self) -> None:
        """One sync (the chore's work); ACLs the target refuses are named once each."""
        if not self.relayed.may_sync():
            return
        plan = self.plan()
        if plan.unavailable:
            self._once("unavailable", f"[acls].sync: no ACLs copied: {plan.unavailable}")
            return
        asked = [(acl, copy) for acl, copy in plan.create if copy not in self._refused]
        refused = acls.create_acls(self.target, [copy for _, copy in asked], self.timeout)
        self._refused.update(refused)
        created = [(acl, copy) for acl, copy in asked if copy not in refused]
        self.metrics.acls_created.inc(len(created))
        self.metrics.acl_failures.inc(len(refused))
        each = log.info if len(created) <= LOG_EACH_CREATED else log.debug
        for acl, copy in created:
            each("ACL copied to the target: %s (source: %s)", copy, acl)
        if len(created) > LOG_EACH_CREATED:
            log.info("%d ACLs copied to the target (each: --debug)", len(created))
        for copy, why in sorted(refused.items()):
            log.warning(
                "the target refused ACL %s: %s (not asked again until a restart)", copy, why
            )
        for principal in plan.unknown_principals:
            self._once(
                f"principal {principal}",
                f"ACLs copied for {principal}, a SCRAM user on the source that the target does "
                "not have: create its credentials there before its clients move",
            )

    def _once(self, key: str, line: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning("%s", line)
