"""Least privilege, tested: the ACLs of each role (bridge/kafka/acls.py) on a secured broker.

The whole flow runs under exactly those ACLs, one SCRAM user per role: ``bridge serve`` (a
server that also writes the index), ``bridge workers``, kcat as a second writer (a pipeline),
``tasks/stream`` over HTTP, and ``bridge verify``. Then every ACL of every role is removed in
turn and the role's command fails in one line naming it, before any replica turns ready. A
wrong password, an untrusted CA, an expired certificate and an address the certificate does not
name each fail within seconds, in one line. The first tests need no broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import re
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)
from support.layout import create_served_topics, fresh_prefix, make_settings
from support.mcp import StreamRead, cancel, create_task, read_stream
from support.procs import Bridge, Proc, bridge_env, free_port
from support.waits import BOUND, wait_until

from bridge.config import Settings
from bridge.kafka.acls import (
    DOC,
    ROLE_NEEDS,
    ROLES,
    Access,
    AccessDenied,
    Acl,
    Operation,
    PatternType,
    ResourceType,
    Role,
    check_access,
    create_acls,
    explain,
    index_writer_id,
    index_writer_prefix,
    kafka_acls_commands,
    markdown_table,
    role_acls,
    roles_acls,
    worker_group,
)
from bridge.log.publisher import TaskEventPublisher
from bridge.tasks.tools import job_topics
from bridge.workers.sdk import Worker
from bridgedev.kafka import SecureBroker

DOCS = Path(__file__).resolve().parent.parent / DOC
#: A misconfiguration or a missing ACL must be reported within this many seconds.
FAST_S = 20.0
#: The demo pack has one tool, so each role's ACLs line up one to one with its needs.
PACK = "demo"
#: The demo tool's job topic under the default prefix (the docs' kafka-acls.sh examples).
PACK_JOB = "mcpbridge.jobs.agent_run"
#: What each role runs (the pipeline is any producer: here the bridge's publisher SDK).
COMMANDS: dict[Role, list[str]] = {
    "server": ["serve", "--port", "0"],
    "worker": ["workers", "--pack", PACK],
}


# --- the ACLs as data (no broker) -----------------------------------------------------------


def test_the_docs_show_each_roles_acls_exactly_as_the_code_lists_them() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for role in ROLES:
        match = re.search(rf"<!-- acls:{role} -->\n(.*?)\n<!-- /acls:{role} -->", text, re.S)
        assert match is not None, f"no table for role {role} in {DOC}"
        assert match.group(1) == markdown_table(role), f"{DOC}: the table of role {role}"


def test_the_docs_kafka_acls_examples_are_the_ones_the_code_renders() -> None:
    text = DOCS.read_text(encoding="utf-8")
    topics = make_settings("unused:9092", "mcpbridge").topics
    for role in ROLES:
        for command in kafka_acls_commands(f"User:{role}", role_acls(role, topics, [PACK_JOB])):
            assert command in text, f"{DOC} lacks: {command}"


def test_the_public_names_of_the_acls_module_are_its_all() -> None:
    import bridge.kafka.acls as module

    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and getattr(value, "__module__", None) == module.__name__
        and (callable(value) or isinstance(value, type))
    }
    assert public <= set(module.__all__), public - set(module.__all__)
    assert all(hasattr(module, name) for name in module.__all__)


def test_the_group_and_transactional_ids_are_those_the_worker_and_the_indexer_use() -> None:
    settings = make_settings("unused:9092", fresh_prefix())
    t = settings.topics
    assert Worker(settings, {}).group_id == worker_group(t)
    # One prefixed ACL covers the index writer of every partition, and nothing of the workers'.
    txn = [a for a in role_acls("server", t) if a.resource_type is ResourceType.TRANSACTIONAL_ID]
    assert [(a.name, a.pattern_type) for a in txn] == [
        (index_writer_prefix(t), PatternType.PREFIXED)
    ]
    assert all(index_writer_id(t, p).startswith(txn[0].name) for p in range(100))
    assert not worker_group(t).startswith(txn[0].name)


def test_no_acl_is_implied_by_another_so_each_can_be_missed() -> None:
    # DESCRIBE comes with READ and WRITE, and no role needs the cluster: a listed ACL that
    # another implied could be removed without a refusal, and would not be least privilege.
    for role in ROLES:
        acls = role_acls(role, make_settings("unused:9092", "p").topics, ["p.jobs.t"])
        assert len(set(acls)) == len(acls), role
        assert {acl.operation for acl in acls} <= {Operation.READ, Operation.WRITE}, role
        assert all(acl.resource_type is not ResourceType.CLUSTER for acl in acls), role


def test_a_refusal_names_the_acls_of_its_resource_that_the_roles_need() -> None:
    settings = make_settings("unused:9092", "p", tool_packs=[PACK])
    access = Access(("server",), ("p.jobs.agent_run",))

    def candidates(exc: BaseException, access: Access = access) -> set[str]:
        denied = explain(exc, access, settings)
        assert denied is not None, exc
        return {str(acl) for acl in denied.missing}

    events = TopicAuthorizationFailedError({"p.task-events"})
    assert candidates(events) == {
        "READ on TOPIC 'p.task-events'",
        "WRITE on TOPIC 'p.task-events'",
    }
    assert candidates(TransactionalIdAuthorizationFailed()) == {
        "WRITE on TRANSACTIONAL_ID 'p.index.' (prefixed)"
    }
    worker = Access(("worker",), ("p.jobs.agent_run",))
    wrapped = RuntimeError("the worker failed")
    wrapped.__cause__ = GroupAuthorizationFailedError("p.workers")
    assert candidates(wrapped, worker) == {"READ on GROUP 'p.workers'"}
    # an idempotent producer with no WRITE anywhere is refused its producer id by the cluster
    assert candidates(ClusterAuthorizationFailedError(), Access(("pipeline",))) == {
        "WRITE on TOPIC 'p.task-events'"
    }
    assert explain(KafkaConnectionError("down"), access, settings) is None


def test_one_missing_acl_is_one_line_with_the_command_that_grants_it() -> None:
    acl = Acl(ResourceType.GROUP, "p.workers", Operation.READ)
    line = str(AccessDenied("User:worker", ["worker"], [acl]))
    assert "\n" not in line
    assert line.startswith("Kafka denies User:worker (role worker) READ on GROUP 'p.workers'")
    assert "--allow-principal User:worker --operation Read --group p.workers" in line
    assert DOC in line


# --- on the secured broker: helpers ---------------------------------------------------------


def secured(broker: SecureBroker, user: str, prefix: str, **overrides: Any) -> Settings:
    """Test-sized settings on ``prefix`` connecting as ``user`` (SCRAM-SHA-512 over TLS)."""
    values = {**broker.info.client_settings(user), "tool_packs": [PACK], **overrides}
    return make_settings(broker.info.bootstrap_servers, prefix, **values)


def user_env(
    broker: SecureBroker,
    settings: Settings,
    user: str,
    secrets: Path,
    *,
    password: str | None = None,
    **extra: str,
) -> dict[str, str]:
    """Environment of a `bridge` subprocess on ``settings``' topics as ``user`` (with
    ``password`` if given, else the right one), the password in a file as a Kubernetes Secret
    would give it, topics left to the operator."""
    secret = secrets / f"{user}.password"
    secret.write_text((password or broker.info.users[user]) + "\n")
    secret.chmod(0o600)
    security = {
        "BRIDGE_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "BRIDGE_KAFKA__TLS__CA_FILE": str(broker.info.ca_file),
        "BRIDGE_KAFKA__SASL__MECHANISM": "SCRAM-SHA-512",
        "BRIDGE_KAFKA__SASL__USERNAME": user,
        "BRIDGE_KAFKA__SASL__PASSWORD_FILE": str(secret),
        "BRIDGE_TOPICS__AUTO_CREATE": "false",
    }
    return bridge_env(settings, **{**security, **extra})


@dataclass
class Exited:
    """A `bridge` command run to its end."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def one_clear_line(self, command: str, *needles: str) -> str:
        """Its only stderr line (the test fails unless it is one line, exit status 2, fast,
        starting with ``bridge <command>:`` and holding every needle)."""
        lines = self.stderr.strip().splitlines()
        assert len(lines) == 1, self.stderr + self.stdout
        line = lines[0]
        assert line.startswith(f"bridge {command}: "), line
        for needle in needles:
            assert needle in line, line
        assert self.returncode == 2, self.stderr
        assert self.seconds < FAST_S, f"took {self.seconds:.1f} s"
        return line


async def run_bridge(args: list[str], env: dict[str, str]) -> Exited:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge.cli",
        *args,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(3 * FAST_S):  # only stops a hang; the assertions bound it
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return Exited(proc.returncode or 0, out.decode(), err.decode(), time.monotonic() - started)


@pytest.fixture
def layout(secure_kafka: SecureBroker) -> Settings:
    """The admin's settings on a fresh prefix, with the layout and the demo tool's job topic
    created (under ACLs topics are the operator's)."""
    admin = secured(secure_kafka, "admin", fresh_prefix("acl"))
    create_served_topics(admin)
    return admin


def kcat_mechanism() -> str:
    """SCRAM-SHA-512, unless kcat's librdkafka predates 2.6.1, whose SCRAM Kafka 4 brokers
    refuse (librdkafka PR #4895; Debian bookworm has 2.0.2): then PLAIN, also over TLS."""
    version = subprocess.run(["kcat", "-V"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"librdkafka (\d+)\.(\d+)\.(\d+)", version)
    assert found is not None, version
    return "SCRAM-SHA-512" if tuple(map(int, found.groups())) >= (2, 6, 1) else "PLAIN"


async def kcat_write(broker: SecureBroker, topic: str, task_id: str, event: dict[str, Any]) -> None:
    """One JSON task event written by kcat, authenticated as the pipeline user over TLS."""
    security = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": kcat_mechanism(),
        "sasl.username": "pipeline",
        "sasl.password": broker.info.users["pipeline"],
        "ssl.ca.location": str(broker.info.ca_file),
        "partitioner": "murmur2_random",  # the Java client's partitioner, as the bridge's
    }
    options = [arg for key, value in security.items() for arg in ("-X", f"{key}={value}")]
    proc = await asyncio.create_subprocess_exec(
        *["kcat", "-P", "-b", broker.info.bootstrap_servers, "-t", topic, "-k", task_id],
        *["-H", "content-type=application/json", *options],
        stdin=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(BOUND):
        _, err = await proc.communicate(json.dumps(event).encode() + b"\n")
    assert proc.returncode == 0, err.decode()


# --- the whole flow under exactly the roles' ACLs -------------------------------------------


async def test_the_whole_flow_runs_under_exactly_the_acls_of_each_role(
    secure_kafka: SecureBroker, layout: Settings, tmp_path: Path
) -> None:
    jobs = job_topics(layout)
    grants: dict[str, tuple[Role, ...]] = {
        "server": ("server",),
        "worker": ("worker",),
        "pipeline": ("pipeline",),
    }
    for user, roles in grants.items():
        await create_acls(layout, f"User:{user}", roles_acls(roles, layout.topics, jobs))

    env = user_env(secure_kafka, layout, "server", tmp_path)
    bridge = Bridge(layout, free_port(), env, tmp_path)
    worker_env = user_env(secure_kafka, layout, "worker", tmp_path)
    bridge.workers.append(
        Proc("worker", ["workers", "--pack", PACK], worker_env, tmp_path / "worker.log").start()
    )
    try:
        await asyncio.to_thread(bridge.start_server)
        await run_a_task_to_its_end(bridge.url)
        await stream_a_task_with_a_second_writer(secure_kafka, layout, bridge.url)
    finally:
        bridge.stop()
    logs = "\n".join(proc.tail(400) for proc in [bridge.server, *bridge.workers] if proc)
    assert "AuthorizationFailed" not in logs, logs

    verify_env = user_env(secure_kafka, layout, "server", tmp_path)
    verified = await run_bridge(["verify"], verify_env)
    assert verified.returncode == 0, verified.stderr
    assert "verify: OK" in verified.stdout, verified.stdout


async def run_a_task_to_its_end(url: str) -> None:
    """tools/call -> the worker (group, job topic) -> its events -> tasks/stream."""
    async with httpx.AsyncClient(timeout=BOUND) as http:
        task = await create_task(http, url, "agent_run", {"prompt": "acl", "steps": 4})
    async with asyncio.timeout(BOUND):
        out = await read_stream(url, task)
    types = [event["type"] for event in out.events]
    assert out.seqs == list(range(len(types)))
    assert types[0] == "io.mcpbridge.task.created" and len(types) == 4 + 2, types
    assert out.events[-1]["payload"]["status"] == "completed"


async def stream_a_task_with_a_second_writer(
    broker: SecureBroker, settings: Settings, url: str
) -> None:
    """kcat writes into a running task's log as the pipeline; a cancel goes through the
    control topic (server writes it, the worker reads it and writes the outcome)."""
    async with httpx.AsyncClient(timeout=BOUND) as http:
        args = {"prompt": "long", "steps": 10_000, "delay_ms": 50}
        task = await create_task(http, url, "agent_run", args)
    seen = StreamRead()
    reading = asyncio.create_task(read_stream(url, task, into=seen))

    def types() -> list[str]:
        assert not reading.done(), f"the stream ended early: {seen}"
        return [event["type"] for event in seen.events]

    try:
        await wait_until(lambda: len(types()) > 2, what="the worker's first events are streamed")
        await kcat_write(
            broker,
            settings.topics.events,
            task,
            {"type": "com.example.pipeline", "payload": {"writer": "kcat"}},
        )
        await wait_until(
            lambda: "com.example.pipeline" in types(), what="the pipeline's event is streamed"
        )
        await cancel(url, task)
        async with asyncio.timeout(BOUND):
            out = await reading
    finally:
        reading.cancel()
    assert out.seqs == list(range(len(out.events)))
    assert out.events[-1]["payload"]["status"] == "cancelled"


# --- every ACL of every role, missed in turn ------------------------------------------------


def _one_missing() -> list[Any]:
    return [
        pytest.param(role, index, id=f"{role}-without-{need.operation.name.lower()}-{need.target}")
        for role in ROLES
        for index, need in enumerate(ROLE_NEEDS[role])
    ]


@pytest.mark.parametrize(("role", "index"), _one_missing())
async def test_a_role_without_one_of_its_acls_is_refused_in_one_line_naming_it(
    role: Role, index: int, secure_kafka: SecureBroker, layout: Settings, tmp_path: Path
) -> None:
    acls = role_acls(role, layout.topics, job_topics(layout))
    removed = acls[index]
    assert removed.operation is ROLE_NEEDS[role][index].operation  # one job topic: in step
    await create_acls(layout, f"User:{role}", [acl for acl in acls if acl != removed])

    if role == "pipeline":
        await a_pipeline_is_told_what_it_lacks(secure_kafka, layout, removed)
        return
    env = user_env(secure_kafka, layout, role, tmp_path)
    done = await run_bridge(COMMANDS[role], env)
    command = COMMANDS[role][0]
    done.one_clear_line(command, f"User:{role}", str(removed), DOC, "kafka-acls.sh")
    assert "Application startup" not in done.stdout + done.stderr  # never served, never ready


async def a_pipeline_is_told_what_it_lacks(
    broker: SecureBroker, admin: Settings, removed: Acl
) -> None:
    """A pipeline runs no bridge command: the publisher SDK's refusal, explained, and the
    check a pipeline may run first name the missing ACL."""
    settings = secured(broker, "pipeline", admin.topics.prefix)
    access = Access(("pipeline",))
    with pytest.raises(AccessDenied) as checked:
        await check_access(settings, access)
    assert checked.value.missing == (removed,)
    with pytest.raises(Exception) as refused:  # whatever aiokafka raises
        async with asyncio.timeout(BOUND), TaskEventPublisher(settings) as publisher:
            await publisher.publish("task-1", "com.example.pipeline", {})
    denied = explain(refused.value, access, settings)
    assert denied is not None, refused.value
    assert denied.missing == (removed,), str(denied)


async def test_a_writer_that_may_only_describe_its_transactional_id_never_turns_ready(
    secure_kafka: SecureBroker, layout: Settings, tmp_path: Path
) -> None:
    """The check before the start sees a transactional id it may describe (asking about WRITE
    would fence the running writer): the writer's own start is refused, explained in one line
    in the log, and the replica exits without having been ready."""
    acls = roles_acls(("server",), layout.topics, job_topics(layout))
    prefix = index_writer_prefix(layout.topics)
    txn = Acl(ResourceType.TRANSACTIONAL_ID, prefix, Operation.WRITE, PatternType.PREFIXED)
    describe_only = Acl(txn.resource_type, txn.name, Operation.DESCRIBE, PatternType.PREFIXED)
    await create_acls(layout, "User:server", [*(a for a in acls if a != txn), describe_only])
    env = user_env(secure_kafka, layout, "server", tmp_path)
    port = free_port()
    server = Proc("bridge", ["serve", "--port", str(port)], env, tmp_path / "bridge.log").start()
    try:
        await wait_until(lambda: not server.alive(), what="the replica exits")
    finally:
        server.stop()
    log = server.tail(200)
    assert server.popen is not None and server.popen.returncode != 0, log
    line = "Kafka refused User:server (role server) (TransactionalIdAuthoriz"
    assert line in log and str(txn) in log, log
    assert "Application startup complete" not in log, log


async def test_a_replica_asked_to_create_topics_under_acls_is_told_that_it_is_an_operators_job(
    secure_kafka: SecureBroker, layout: Settings, tmp_path: Path
) -> None:
    acls = roles_acls(("server",), layout.topics, job_topics(layout))
    await create_acls(layout, "User:server", acls)
    env = user_env(secure_kafka, layout, "server", tmp_path, BRIDGE_TOPICS__AUTO_CREATE="true")
    done = await run_bridge(COMMANDS["server"], env)
    done.one_clear_line(
        "serve", "an operator creates the topics", "BRIDGE_TOPICS__AUTO_CREATE=false"
    )


# --- failures to connect: each one line, within seconds -------------------------------------


async def test_a_wrong_password_fails_fast_in_one_line(
    secure_kafka: SecureBroker, layout: Settings, tmp_path: Path
) -> None:
    env = user_env(secure_kafka, layout, "server", tmp_path, password="not-the-password")
    done = await run_bridge(COMMANDS["server"], env)
    done.one_clear_line("serve", "SCRAM-SHA-512", "'server'", "BRIDGE_KAFKA__SASL__PASSWORD")


async def test_a_ca_the_client_does_not_trust_fails_fast_in_one_line(
    secure_kafka: SecureBroker, layout: Settings, tmp_path: Path
) -> None:
    other_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    env = user_env(
        secure_kafka, layout, "server", tmp_path, BRIDGE_KAFKA__TLS__CA_FILE=str(other_ca)
    )
    done = await run_bridge(COMMANDS["server"], env)
    done.one_clear_line("serve", "not trusted", "BRIDGE_KAFKA__TLS__CA_FILE")


async def test_an_expired_certificate_of_a_trusted_ca_fails_fast_in_one_line(
    secure_kafka: SecureBroker, layout: Settings, tmp_path: Path
) -> None:
    ca = trustme.CA()
    now = datetime.datetime.now(datetime.UTC)
    expired = ca.issue_cert(
        "127.0.0.1",
        "localhost",
        not_before=now - datetime.timedelta(days=2),
        not_after=now - datetime.timedelta(days=1),
    )
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    async with tls_listener(expired) as port:
        env = user_env(
            secure_kafka,
            layout,
            "server",
            tmp_path,
            BRIDGE_KAFKA__BOOTSTRAP_SERVERS=f"127.0.0.1:{port}",
            BRIDGE_KAFKA__TLS__CA_FILE=str(ca_file),
        )
        done = await run_bridge(COMMANDS["server"], env)
    done.one_clear_line("serve", "not valid now", "expired")


async def test_an_address_the_certificate_does_not_name_fails_fast_in_one_line(
    secure_kafka: SecureBroker, layout: Settings, tmp_path: Path
) -> None:
    host, port = secure_kafka.info.bootstrap_servers.rsplit(":", 1)
    async with tcp_forwarder("127.0.0.2", host, int(port)) as forwarded:
        env = user_env(
            secure_kafka,
            layout,
            "server",
            tmp_path,
            BRIDGE_KAFKA__BOOTSTRAP_SERVERS=f"127.0.0.2:{forwarded}",
        )
        done = await run_bridge(COMMANDS["server"], env)
    done.one_clear_line("serve", "does not name the host", "BRIDGE_KAFKA__BOOTSTRAP_SERVERS")


@contextlib.asynccontextmanager
async def tls_listener(cert: trustme.LeafCert) -> AsyncIterator[int]:
    """A TLS server on 127.0.0.1 presenting ``cert`` (it never gets as far as Kafka)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)

    async def handshake_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(handshake_only, "127.0.0.1", 0, ssl=context)
    async with server:
        yield server.sockets[0].getsockname()[1]


@contextlib.asynccontextmanager
async def tcp_forwarder(listen: str, host: str, port: int) -> AsyncIterator[int]:
    """Bytes to ``listen``:<port yielded> go to ``host``:``port`` and back."""

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        await asyncio.gather(pump(reader, upstream_writer), pump(upstream_reader, writer))

    server = await asyncio.start_server(forward, listen, 0)
    async with server:
        yield server.sockets[0].getsockname()[1]
