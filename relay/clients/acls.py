"""Topic ACLs of a cluster (DescribeAcls, CreateAcls) and its SCRAM users
(DescribeUserScramCredentials), in ktm's own terms (`TopicAcl`), so that the rules of what is
copied (relay.pipelines.relay.acl_sync) never see a kafka-python type.

Part of the Kafka seam (relay.clients): the only modules that import kafka-python.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
)
from kafka.errors import SecurityDisabledError

from relay.clients.admin import admin_client, supported
from relay.config import ClusterConfig


@dataclass(frozen=True, order=True)
class TopicAcl:
    """One ACL binding of resource type TOPIC: `pattern` LITERAL or PREFIXED, `operation` and
    `permission` the names Kafka gives them ("READ", "ALLOW")."""

    pattern: str
    name: str  # the topic, or the prefix
    principal: str  # "User:alice"
    host: str
    operation: str
    permission: str

    def __str__(self) -> str:
        kind = "prefix" if self.pattern == "PREFIXED" else "topic"
        host = "" if self.host == "*" else f" from {self.host}"
        who = f"{self.principal}{host}"
        return f"{self.permission} {self.operation} on {kind} {self.name} for {who}"


class AclsUnavailable(Exception):
    """The cluster keeps no ACLs (no authorizer), or does not implement the ACL calls."""


def topic_acls(cluster: ClusterConfig, timeout: float) -> list[TopicAcl]:
    """Every ACL on topics (literal and prefixed patterns), sorted."""
    wanted = ACLFilter(
        principal=None,
        host=None,
        operation=ACLOperation.ANY,
        permission_type=ACLPermissionType.ANY,
        resource_pattern=ResourcePatternFilter(
            ResourceType.TOPIC, None, ACLResourcePatternType.ANY
        ),
    )
    try:
        with admin_client(cluster, timeout) as admin, supported("DescribeAcls"):
            found, _ = admin.describe_acls(wanted)
    except SecurityDisabledError as exc:
        where = "the target" if cluster.name == "target" else f"source {cluster.name}"
        raise AclsUnavailable(f"{where} has no authorizer ({exc})") from exc
    return sorted(
        TopicAcl(
            acl.resource_pattern.pattern_type.name,
            acl.resource_pattern.resource_name,
            acl.principal,
            acl.host,
            acl.operation.name,
            acl.permission_type.name,
        )
        for acl in found
        if acl.resource_pattern.pattern_type.name in ("LITERAL", "PREFIXED")
    )


def create_acls(
    cluster: ClusterConfig, acls: Iterable[TopicAcl], timeout: float
) -> dict[TopicAcl, str]:
    """Create `acls` in one request; the ones the cluster refused, with why."""
    wanted = sorted(set(acls))
    if not wanted:
        return {}
    bindings = [
        ACL(
            principal=a.principal,
            host=a.host,
            operation=ACLOperation[a.operation],
            permission_type=ACLPermissionType[a.permission],
            resource_pattern=ResourcePattern(
                ResourceType.TOPIC, a.name, ACLResourcePatternType[a.pattern]
            ),
        )
        for a in wanted
    ]
    try:
        with admin_client(cluster, timeout) as admin, supported("CreateAcls"):
            answer = admin.create_acls(bindings)
    except SecurityDisabledError as exc:
        raise AclsUnavailable(f"the cluster has no authorizer ({exc})") from exc
    # kafka-python lists the refused ones' errors in request order, without the ACL
    made = {id(acl) for acl in answer["succeeded"]}
    refused = [a for a, acl in zip(wanted, bindings, strict=True) if id(acl) not in made]
    return {
        acl: getattr(error, "__name__", str(error))
        for acl, error in zip(refused, answer["failed"], strict=False)
    }


def scram_users(cluster: ClusterConfig, timeout: float) -> frozenset[str]:
    """The users that have SCRAM credentials on the cluster (Unsupported: it does not say)."""
    with admin_client(cluster, timeout) as admin, supported("DescribeUserScramCredentials"):
        found = admin.describe_user_scram_credentials()
    return frozenset(user for user, data in found.items() if not data.get("error"))
