"""Least privilege as code: the Kafka ACLs each role of the bridge needs, and what a refusal means.

Three roles, whose tables docs/kafka-security.md renders from :data:`ROLE_NEEDS`: ``server`` (a
serving replica, which also writes the index of the partitions it owns), ``worker``
(``bridge workers``) and ``pipeline`` (an existing producer that only writes task events). :func:`role_acls` gives a role's ACLs for a topic prefix and job topics;
:func:`create_acls` creates them as an admin would; :func:`check_access` asks Kafka which of
them the connected principal lacks (a missing WRITE would otherwise show only at the first
``tools/call``); :func:`explain` turns an authorization error of aiokafka into the same one line.

Every ACL listed is needed (tests/test_kafka_acls.py removes each in turn and sees the role
refused); DESCRIBE is never listed, since Kafka implies it from READ and WRITE, and idempotent
producers need no IDEMPOTENT_WRITE on the cluster since Kafka 3.0 (KIP-679). This module creates
no topics and no users: under ACLs the topics are the operator's (``bridge topics create`` run
as an admin, or Strimzi KafkaTopics), so the roles hold no CREATE.

aiokafka 0.14 has the ACL wire structs but no admin methods for them, and its Metadata request
stops at v5 while authorized operations came with v8 (KIP-430): both go out here through the
admin client's request path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Literal, get_args

from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    GroupAuthorizationFailedError,
    IncompatibleBrokerVersion,
    NotCoordinatorError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnknownTopicOrPartitionError,
    for_code,
)
from aiokafka.protocol.admin import (
    CreateAclsRequest,
    DescribeAclsRequest,
    DescribeGroupsResponse_v3,
)
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Int16, Int32, Schema, String

from bridge.config import Settings, TopicSettings
from bridge.kafka.admin import kafka_admin
from bridge.kafka.topics import TopicLayoutError

__all__ = [
    "DOC",
    "ROLES",
    "ROLE_NEEDS",
    "Access",
    "AccessDenied",
    "Acl",
    "Need",
    "Operation",
    "PatternType",
    "ResourceType",
    "Role",
    "bridge_group",
    "check_access",
    "create_acls",
    "describe_acls",
    "explain",
    "index_writer_id",
    "index_writer_prefix",
    "indexer_transactional_id",
    "is_refusal",
    "kafka_acls_commands",
    "markdown_table",
    "missing_acls",
    "principal_of",
    "refusals_explained",
    "role_acls",
    "roles_acls",
    "source_acls",
    "webhook_group",
    "worker_group",
]

#: Where the ACLs of every role are written down for people.
DOC = "docs/kafka-security.md"


class ResourceType(IntEnum):
    """Kafka's ACL resource types (their wire codes)."""

    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(IntEnum):
    """How an ACL's name matches resources (wire codes)."""

    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    """Kafka's ACL operations (wire codes; also the bit of KIP-430's authorized operations)."""

    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


_ALLOW = 3
_ANY = 1

Role = Literal["server", "worker", "pipeline"]
ROLES: tuple[Role, ...] = get_args(Role)


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW ACL (from any host): ``operation`` on a resource."""

    resource_type: ResourceType
    name: str
    operation: Operation
    pattern_type: PatternType = PatternType.LITERAL
    #: Why the role needs it (the docs' last column); not part of the binding.
    why: str = field(default="", compare=False)

    def __str__(self) -> str:
        prefixed = " (prefixed)" if self.pattern_type is PatternType.PREFIXED else ""
        return f"{self.operation.name} on {self.resource_type.name} {self.name!r}{prefixed}"


Target = Literal[
    "events",
    "index",
    "updates",
    "control",
    "jobs",
    "subscriptions",
    "workers",
    "bridge",
    "webhooks",
    "index-writers",
]


@dataclass(frozen=True)
class Need:
    """What a role does with one of the layout's resources, before the prefix is known."""

    resource_type: ResourceType
    target: Target
    operation: Operation
    why: str
    pattern_type: PatternType = PatternType.LITERAL


_T, _G, _X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
_READ, _WRITE = Operation.READ, Operation.WRITE

#: The ACLs of each role, read from what its code does (bridge/log, bridge/tasks,
#: bridge/workers) and proven minimal by the tests.
ROLE_NEEDS: dict[Role, tuple[Need, ...]] = {
    "server": (
        Need(_T, "events", _READ, "the indexer tails its partitions and the reader serves history"),
        Need(_T, "events", _WRITE, "task.created and the statuses the server writes"),
        Need(_T, "index", _READ, "restoring the seq index of the partitions it gains"),
        Need(_T, "index", _WRITE, "the seq index of the partitions it owns, in transactions"),
        Need(_T, "updates", _READ, "the task.updated event source reads its owner's updates"),
        Need(
            _T,
            "updates",
            _WRITE,
            "one task-updates record per status change, in the same transactions",
        ),
        Need(_T, "control", _WRITE, "cancel requests and input answers for the workers"),
        Need(_T, "jobs", _WRITE, "a job request per tools/call, one topic per tool"),
        Need(
            _T,
            "subscriptions",
            _READ,
            "webhook subscriptions (they hold callback secrets, sealed under a key outside Kafka)",
        ),
        Need(_T, "subscriptions", _WRITE, "subscribe, unsubscribe, delivered positions"),
        Need(_G, "webhooks", _READ, "the webhook group: which replica delivers which partition"),
        Need(_G, "bridge", _READ, "the replicas' group: joining it (no offsets are committed)"),
        Need(
            _X,
            "index-writers",
            _WRITE,
            "one index writer per events partition; a partition's next owner fences the last",
            PatternType.PREFIXED,
        ),
    ),
    "worker": (
        Need(_G, "workers", _READ, "the job consumer group: joining it, committing offsets"),
        Need(_T, "jobs", _READ, "the jobs of its tools, one topic per tool"),
        Need(_T, "control", _READ, "cancel requests and input answers"),
        Need(_T, "control", _WRITE, "the 'finished' mark after a job's terminal status"),
        Need(_T, "events", _WRITE, "the task's events and its terminal status"),
    ),
    "pipeline": (Need(_T, "events", _WRITE, "the task events it produces"),),
}


def worker_group(topics: TopicSettings) -> str:
    """The consumer group of the workers (the worker SDK's default group id)."""
    return f"{topics.prefix}.workers"


def bridge_group(topics: TopicSettings) -> str:
    """The consumer group through which serving replicas divide the events partitions."""
    return f"{topics.prefix}.bridge"


def index_writer_prefix(topics: TopicSettings) -> str:
    """What every index writer's transactional id starts with (one id per events partition)."""
    return f"{topics.prefix}.index."


def index_writer_id(topics: TopicSettings, partition: int) -> str:
    """The transactional id of the index writer of one events partition: its next owner
    fences the previous one by starting a producer with the same id."""
    return f"{index_writer_prefix(topics)}{partition}"


def webhook_group(topics: TopicSettings) -> str:
    """The consumer group that shares webhook delivery among the serving replicas."""
    return f"{topics.prefix}.webhooks"


def indexer_transactional_id(topics: TopicSettings) -> str:
    """The transactional id of the single index writer of versions before the per-partition
    writers; ``bridge index migrate`` fences it."""
    return f"{topics.prefix}.indexer"


def _names(topics: TopicSettings, target: Target, job_topics: Sequence[str]) -> list[str]:
    if target == "jobs":
        return list(job_topics)
    named = {
        "events": topics.events,
        "index": topics.index,
        "control": topics.control,
        "updates": topics.updates,
        "subscriptions": topics.subscriptions,
        "workers": worker_group(topics),
        "bridge": bridge_group(topics),
        "webhooks": webhook_group(topics),
        "index-writers": index_writer_prefix(topics),
    }
    return [named[target]]


def role_acls(role: Role, topics: TopicSettings, job_topics: Iterable[str] = ()) -> list[Acl]:
    """The ACLs ``role`` needs on the layout of ``topics`` (a settings' ``topics``), with one
    entry per job topic in ``job_topics`` for what it does with jobs."""
    jobs = list(job_topics)
    return [
        Acl(need.resource_type, name, need.operation, need.pattern_type, why=need.why)
        for need in ROLE_NEEDS[role]
        for name in _names(topics, need.target, jobs)
    ]


def roles_acls(
    roles: Iterable[Role], topics: TopicSettings, job_topics: Iterable[str] = ()
) -> list[Acl]:
    """The ACLs of several roles held by one principal (a server that also writes the index),
    each once."""
    jobs = list(job_topics)
    merged: dict[Acl, Acl] = {}
    for role in roles:
        for acl in role_acls(role, topics, jobs):
            merged.setdefault(acl, acl)
    return list(merged.values())


def source_acls(topics: Iterable[str]) -> list[Acl]:
    """READ on each pipeline topic a configured event source reads (not a role's: which topics
    depends on the settings' ``events.sources``)."""
    return [Acl(_T, topic, _READ, why="a configured event source reads it") for topic in topics]


@dataclass(frozen=True)
class Access:
    """What one process needs of Kafka: the ACLs of ``roles`` on the job topics it uses, or
    only those of the ``only`` operations (``bridge verify`` reads)."""

    roles: tuple[Role, ...]
    job_topics: tuple[str, ...] = ()
    only: frozenset[Operation] | None = None
    #: Pipelines' topics that configured event sources read (``events.sources``): READ each.
    source_topics: tuple[str, ...] = ()

    def acls(self, topics: TopicSettings) -> list[Acl]:
        needed = roles_acls(self.roles, topics, self.job_topics) + source_acls(self.source_topics)
        return [acl for acl in needed if self.only is None or acl.operation in self.only]

    @classmethod
    def serving(cls, settings: Settings, job_topics: Iterable[str], *, workers: bool) -> Access:
        """A ``bridge serve`` process: a server, and a worker when it runs the workers
        in-process."""
        roles: list[Role] = ["server"]
        if workers:
            roles.append("worker")
        sources = tuple(dict.fromkeys(source.topic for source in settings.events.sources))
        return cls(tuple(roles), tuple(job_topics), source_topics=sources)


# --- for people: the docs' tables and kafka-acls.sh -----------------------------------------

#: The layout as the docs name it.
DOC_TOPICS = TopicSettings.model_construct(prefix="<prefix>")
DOC_JOB_TOPICS = ("<prefix>.jobs.<tool>",)


def markdown_table(role: Role) -> str:
    """``role``'s ACLs as the markdown table of docs/kafka-security.md."""
    rows = [
        "| Resource type | Pattern | Name | Operation | Why |",
        "|---|---|---|---|---|",
    ]
    for acl in role_acls(role, DOC_TOPICS, DOC_JOB_TOPICS):
        rows.append(
            f"| {acl.resource_type.name} | {acl.pattern_type.name} | `{acl.name}` "
            f"| {acl.operation.name} | {acl.why} |"
        )
    return "\n".join(rows)


_CLI_RESOURCE = {
    ResourceType.TOPIC: "--topic",
    ResourceType.GROUP: "--group",
    ResourceType.TRANSACTIONAL_ID: "--transactional-id",
}


def _cli_operation(operation: Operation) -> str:
    return operation.name.title().replace("_", "")  # DESCRIBE_CONFIGS -> DescribeConfigs


def kafka_acls_commands(principal: str, acls: Iterable[Acl]) -> list[str]:
    """``kafka-acls.sh`` commands creating ``acls`` for ``principal`` (``User:name``), one per
    resource; ``$BOOTSTRAP`` and ``admin.properties`` are the caller's."""
    operations: dict[tuple[ResourceType, PatternType, str], list[Operation]] = {}
    for acl in acls:
        key = (acl.resource_type, acl.pattern_type, acl.name)
        operations.setdefault(key, []).append(acl.operation)
    commands = []
    for (rtype, pattern, name), ops in operations.items():
        words = [
            "kafka-acls.sh --bootstrap-server $BOOTSTRAP --command-config admin.properties",
            f"--add --allow-principal {principal}",
            *(f"--operation {_cli_operation(op)}" for op in ops),
            "--cluster" if rtype is ResourceType.CLUSTER else f"{_CLI_RESOURCE[rtype]} {name}",
        ]
        if pattern is PatternType.PREFIXED:
            words.append("--resource-pattern-type prefixed")
        commands.append(" ".join(words))
    return commands


# --- who is asking ---------------------------------------------------------------------------


def principal_of(settings: Settings) -> str:
    """The Kafka principal the settings authenticate as, as the authorizer names it."""
    protocol = settings.kafka.security_protocol
    if protocol.startswith("SASL_"):
        sasl = settings.kafka.sasl
        if sasl.mechanism != "OAUTHBEARER" and sasl.username:
            return f"User:{sasl.username}"
        return "User:<the OAUTHBEARER token's subject>"
    if protocol == "SSL" and settings.kafka.tls.cert_file is not None:
        return f"User:<the subject of {settings.kafka.tls.cert_file}>"
    return "User:ANONYMOUS"


# --- the one line ----------------------------------------------------------------------------


class AccessDenied(Exception):
    """Kafka refuses ``principal`` something that ``roles`` need.

    ``missing``: the ACLs it lacks; with ``refused`` (the name of the error Kafka answered)
    they are the candidates, when the error does not say which one it was.
    """

    def __init__(
        self,
        principal: str,
        roles: Iterable[Role],
        missing: Sequence[Acl],
        refused: str | None = None,
    ) -> None:
        self.principal = principal
        self.roles = tuple(roles)
        self.missing = tuple(missing)
        self.refused = refused
        super().__init__(principal, self.roles, self.missing, refused)

    def __str__(self) -> str:
        plural = "s" if len(self.roles) > 1 else ""
        who = f"{self.principal} (role{plural} {', '.join(self.roles)})"
        where = f"the ACLs of each role are in {DOC}"
        if self.refused is not None:
            candidates = ", ".join(str(acl) for acl in self.missing) or "nothing the roles list"
            return (
                f"Kafka refused {who} ({self.refused}); the roles need {candidates}: check "
                f"these ACLs; {where}"
            )
        if len(self.missing) == 1:
            (acl,) = self.missing
            (command,) = kafka_acls_commands(self.principal, [acl])
            return f"Kafka denies {who} {acl}; grant it, e.g. `{command}` ({where})"
        listed = ", ".join(str(acl) for acl in self.missing)
        return f"Kafka denies {who} {len(self.missing)} ACLs they need: {listed}; {where}"


_REFUSED: tuple[tuple[type[Exception], ResourceType], ...] = (
    (TopicAuthorizationFailedError, ResourceType.TOPIC),
    (GroupAuthorizationFailedError, ResourceType.GROUP),
    (TransactionalIdAuthorizationFailed, ResourceType.TRANSACTIONAL_ID),
    (ClusterAuthorizationFailedError, ResourceType.CLUSTER),
)


def _refusal(exc: BaseException) -> tuple[BaseException, ResourceType] | None:
    """The authorization error in ``exc``'s chain (aiokafka wraps some), and its resource."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for error, rtype in _REFUSED:
            if isinstance(current, error):
                return current, rtype
        current = current.__cause__ or current.__context__
    return None


def is_refusal(exc: BaseException) -> bool:
    """True when Kafka refused an authorization somewhere in ``exc``'s chain."""
    return _refusal(exc) is not None


def explain(exc: BaseException, access: Access, settings: Settings) -> AccessDenied | None:
    """``exc`` as an :class:`AccessDenied` if Kafka refused an authorization in it; else None
    (the caller re-raises ``exc``).

    aiokafka's errors name the resource type, sometimes the topics, never the operation: the
    candidates are the ACLs ``access`` needs on that type (on the named resources if any).
    """
    found = _refusal(exc)
    if found is None:
        return None
    error, rtype = found
    needed = _candidates(access.acls(settings.topics), rtype)
    text = str(error)
    named = [acl for acl in needed if acl.name in text]
    return AccessDenied(principal_of(settings), access.roles, named or needed, type(error).__name__)


def _candidates(acls: list[Acl], rtype: ResourceType) -> list[Acl]:
    if rtype is ResourceType.CLUSTER:
        # No role holds a cluster ACL: an idempotent producer's id is granted for WRITE on any
        # topic (Kafka 3.0+), and refused as a cluster authorization when it has none.
        return [acl for acl in acls if acl.operation is Operation.WRITE]
    return [acl for acl in acls if acl.resource_type is rtype]


@contextlib.contextmanager
def refusals_explained(access: Access, settings: Settings) -> Iterator[None]:
    """An authorization refusal in the block (a client's, while it starts or runs) is raised
    as the :class:`AccessDenied` :func:`explain` makes of it."""
    try:
        yield
    except Exception as exc:
        denied = explain(exc, access, settings)
        if denied is None:
            raise
        raise denied from exc


# --- asking Kafka ----------------------------------------------------------------------------


async def check_access(settings: Settings, access: Access) -> None:
    """Raise :class:`AccessDenied` if the settings' principal lacks any ACL ``access`` needs;
    then :class:`~bridge.kafka.topics.TopicLayoutError` if a topic it uses does not exist (under
    ACLs, only one the principal may describe says so)."""
    missing, absent = await _missing_and_absent(settings, access.acls(settings.topics))
    if missing:
        raise AccessDenied(principal_of(settings), access.roles, missing)
    if absent:
        raise TopicLayoutError(
            f"topics missing on Kafka at {settings.kafka.bootstrap_servers}: "
            f"{', '.join(absent)}; under ACLs an operator creates them (`bridge topics create` "
            f"as an admin principal; {DOC})"
        )


async def missing_acls(settings: Settings, acls: Sequence[Acl]) -> list[Acl]:
    """Which of ``acls`` Kafka does not grant the settings' principal (asked as that principal;
    the ACLs of topics that do not exist are not counted)."""
    missing, _absent = await _missing_and_absent(settings, acls)
    return missing


async def _missing_and_absent(
    settings: Settings, acls: Sequence[Acl]
) -> tuple[list[Acl], list[str]]:
    """The ACLs not granted, and the topics that do not exist.

    Topics and groups report the operations granted on them (KIP-430). A transactional id
    answers only whether it may be described: asking about WRITE would take InitProducerId,
    which fences the running writer, so a DESCRIBE-only grant shows when the writer starts
    (through :func:`explain`).
    """
    granted: dict[tuple[ResourceType, str], frozenset[Operation]] = {}
    async with kafka_admin(settings) as admin:
        topics, absent = await _topic_operations(admin, _resources(acls, ResourceType.TOPIC))
        for name, ops in topics.items():
            granted[ResourceType.TOPIC, name] = ops
        for group in _resources(acls, ResourceType.GROUP):
            granted[ResourceType.GROUP, group] = await _group_operations(admin, group)
        for txn in _resources(acls, ResourceType.TRANSACTIONAL_ID):
            granted[ResourceType.TRANSACTIONAL_ID, txn] = await _transaction_operations(admin, txn)
    missing = [
        acl
        for acl in acls
        if acl.resource_type is not ResourceType.CLUSTER
        and acl.name not in absent
        and acl.operation not in granted.get((acl.resource_type, acl.name), frozenset())
    ]
    return missing, absent


def _resources(acls: Iterable[Acl], rtype: ResourceType) -> list[str]:
    return sorted({acl.name for acl in acls if acl.resource_type is rtype})


_EVERYTHING = frozenset(Operation)
#: How long a group's coordinator may take to appear (the offsets topic is created on demand).
COORDINATOR_S = 15.0
_COORDINATOR_MOVING = (
    CoordinatorNotAvailableError,
    CoordinatorLoadInProgressError,
    NotCoordinatorError,
)


def _operations(bits: int) -> frozenset[Operation]:
    if bits == -(2**31):  # "not computed": a broker without an authorizer allows everything
        return _EVERYTHING
    return frozenset(op for op in Operation if bits & (1 << op))


async def _topic_operations(
    admin: Any, topics: list[str]
) -> tuple[dict[str, frozenset[Operation]], list[str]]:
    """The operations granted on each of ``topics``, and those that do not exist."""
    if not topics:
        return {}, []
    try:
        response = await admin._send_request(_AuthorizedMetadataRequest(topics))
    except (IncompatibleBrokerVersion, NotImplementedError):
        return dict.fromkeys(topics, _EVERYTHING), []  # a broker before Kafka 2.3 cannot tell
    granted: dict[str, frozenset[Operation]] = {}
    absent: list[str] = []
    for topic in response.topics:
        code, name = topic[0], topic[1]
        if code == UnknownTopicOrPartitionError.errno:
            absent.append(name)
        elif code == TopicAuthorizationFailedError.errno:
            granted[name] = frozenset()
        elif code:
            raise for_code(code)(f"metadata of topic {name}")
        else:
            granted[name] = _operations(topic[-1])
    return granted, sorted(absent)


async def _group_operations(admin: Any, group: str) -> frozenset[Operation]:
    # The offsets topic behind the coordinator is created on first use: its coordinator may be
    # missing or loading for a moment, which Kafka answers after the authorization check.
    async with asyncio.timeout(COORDINATOR_S):
        while True:
            try:
                return await _described_group_operations(admin, group)
            except GroupAuthorizationFailedError:
                return frozenset()
            except _COORDINATOR_MOVING:
                await asyncio.sleep(0.2)  # retriable; Kafka signals nothing a client can await


async def _described_group_operations(admin: Any, group: str) -> frozenset[Operation]:
    node = await admin.find_coordinator(group)
    try:
        response = await admin._send_request(_AuthorizedGroupRequest(group), node)
    except (IncompatibleBrokerVersion, NotImplementedError):
        return _EVERYTHING  # a broker before Kafka 2.3 cannot tell
    for described in response.groups:
        code, name, bits = described[0], described[1], described[-1]
        if name == group and code:
            raise for_code(code)(f"describe group {group}")
        if name == group:
            return _operations(bits)
    return frozenset()


async def _transaction_operations(admin: Any, transactional_id: str) -> frozenset[Operation]:
    try:
        await admin.find_coordinator(transactional_id, coordinator_type=1)
    except TransactionalIdAuthorizationFailed:
        return frozenset()
    except CoordinatorNotAvailableError:
        pass  # Kafka authorizes before it looks the coordinator up (it may not exist yet)
    return frozenset({Operation.DESCRIBE, Operation.WRITE})


# --- as an admin: creating and listing ACLs ------------------------------------------------

#: How long :func:`create_acls` waits for the broker's authorizer to show new ACLs.
ACL_VISIBLE_S = 30.0


async def create_acls(settings: Settings, principal: str, acls: Iterable[Acl]) -> None:
    """Create ALLOW ``acls`` for ``principal`` (``User:name``) with the settings' (admin)
    principal; returns once the broker enforces them (bounded by :data:`ACL_VISIBLE_S`)."""
    wanted = set(acls)
    async with kafka_admin(settings) as admin:
        for acl in sorted(wanted):
            request = CreateAclsRequest(
                acl.resource_type, acl.name, acl.pattern_type, principal, "*", acl.operation, _ALLOW
            )
            response = await admin._send_request(request)
            for code, message in response.creation_responses:
                if code:
                    raise for_code(code)(f"create ACL {acl} for {principal}: {message}")
        # The controller commits an ACL before the broker's authorizer has it: wait for that.
        async with asyncio.timeout(ACL_VISIBLE_S):
            while not wanted <= await _described(admin, principal):  # noqa: ASYNC110
                await asyncio.sleep(0.1)  # the authorizer signals nothing a client can await


async def describe_acls(settings: Settings, principal: str) -> set[Acl]:
    """The ALLOW ACLs of ``principal`` the broker enforces (as an admin)."""
    async with kafka_admin(settings) as admin:
        return await _described(admin, principal)


async def _described(admin: Any, principal: str) -> set[Acl]:
    request = DescribeAclsRequest(_ANY, None, _ANY, principal, None, _ANY, _ALLOW)
    response = await admin._send_request(request)
    if response.error_code:
        raise for_code(response.error_code)(f"describe ACLs: {response.error_message}")
    found: set[Acl] = set()
    for rtype, name, pattern, entries in response.resources:
        for _principal, _host, operation, _permission in entries:
            found.add(Acl(ResourceType(rtype), name, Operation(operation), PatternType(pattern)))
    return found


# --- Metadata v8: a topic's authorized operations (KIP-430) --------------------------------


class _MetadataResponseV8(Response):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 8
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            Array(
                ("node_id", Int32),
                ("host", String("utf-8")),
                ("port", Int32),
                ("rack", String("utf-8")),
            ),
        ),
        ("cluster_id", String("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            Array(
                ("error_code", Int16),
                ("name", String("utf-8")),
                ("is_internal", Boolean),
                (
                    "partitions",
                    Array(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", Array(Int32)),
                        ("isr_nodes", Array(Int32)),
                        ("offline_replicas", Array(Int32)),
                    ),
                ),
                ("topic_authorized_operations", Int32),
            ),
        ),
        ("cluster_authorized_operations", Int32),
    )


class _MetadataRequestV8(RequestStruct):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 8
    RESPONSE_TYPE = _MetadataResponseV8
    SCHEMA = Schema(
        ("topics", Array(String("utf-8"))),
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
    )


class _AuthorizedMetadataRequest(Request[_MetadataRequestV8]):  # type: ignore[misc]
    """Metadata of ``topics`` with the operations the principal may perform on each; never
    creates a topic."""

    API_KEY = 3

    def __init__(self, topics: list[str]) -> None:
        self._topics = topics

    def build(self, request_struct_class: type[_MetadataRequestV8]) -> _MetadataRequestV8:
        return request_struct_class(self._topics, False, False, True)


# --- DescribeGroups v3: a group's authorized operations ------------------------------------


class _DescribeGroupsRequestV3(RequestStruct):  # type: ignore[misc]
    # aiokafka 0.14's own v3 struct parses the answer as v2, dropping the authorized operations.
    API_KEY = 15
    API_VERSION = 3
    RESPONSE_TYPE = DescribeGroupsResponse_v3
    SCHEMA = Schema(("groups", Array(String("utf-8"))), ("include_authorized_operations", Boolean))


class _AuthorizedGroupRequest(Request[_DescribeGroupsRequestV3]):  # type: ignore[misc]
    """A group's description with the operations the principal may perform on it."""

    API_KEY = 15

    def __init__(self, group: str) -> None:
        self._group = group

    def build(
        self, request_struct_class: type[_DescribeGroupsRequestV3]
    ) -> _DescribeGroupsRequestV3:
        return request_struct_class([self._group], True)
