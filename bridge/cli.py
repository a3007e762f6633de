"""The bridge command line: local Kafka, topics, the server and workers, and tools around the log.

Each subcommand is a small function taking the parsed arguments and the settings; errors that a
user can act on are printed as one line on stderr (``bridge <command>: ...``) with exit status 2,
never as a traceback. Commands that need Kafka check it first (:func:`require_kafka`: it answers,
the clients accept the settings, the topics exist), so a wrong address, protocol or prefix is
one line within seconds rather than a client retrying for minutes.

Logging is configured here and only here (:func:`configure_logging`), for every command.

``bridge kafka``, ``bridge demo`` and ``bridge replay`` run the development package (bridgedev/,
beside this one, not in the runtime wheel or the image); without it they say so in one line
(:func:`development_tooling`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.config import Settings, load_settings
from bridge.keyring import KeyringError

if TYPE_CHECKING:
    from bridge.client import TaskStreamClient
    from bridge.kafka.acls import Access
    from bridge.kafka.topics import TopicReport

__all__ = ["KafkaUnavailable", "UserError", "main"]

log = logging.getLogger("bridge")

#: Bound of the pre-flight's metadata request (the ApiVersions probe before it has its own 5 s).
KAFKA_METADATA_TIMEOUT_S = 10.0
#: Bound of the pre-flight's ACL check (a new group coordinator may take a few seconds).
KAFKA_ACCESS_TIMEOUT_S = 30.0


class UserError(Exception):
    """A failure the user can fix; printed without a traceback."""


class KafkaUnavailable(UserError):
    """Kafka cannot be used as configured: unreachable, not Kafka, refused settings, no topics."""


def _progress(message: str) -> None:
    print(f"… {message}", file=sys.stderr, flush=True)


#: How to get the commands of the development package (bridgedev/), which the runtime install
#: (`pip install .`, the Docker image) leaves out.
DEV_INSTALL = (
    "the development install: `make venv` in a checkout of the repository "
    "(or `pip install -e . -e ./bridgedev` there)"
)


def _is_dev_package(exc: ModuleNotFoundError) -> bool:
    """Whether ``exc`` is the development package missing (not a module missing inside it)."""
    return exc.name is not None and exc.name.split(".")[0] == "bridgedev"


@contextlib.contextmanager
def development_tooling(what: str) -> Iterator[None]:
    """Imports of the development package in the block: missing, they become one
    :class:`UserError` saying that ``what`` needs the development install and how to get it."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if not _is_dev_package(exc):
            raise
        raise UserError(f"{what} is development tooling and needs {DEV_INSTALL}") from None


def with_kafka(settings: Settings) -> Settings:
    """``settings`` with bootstrap servers filled from the running local broker if unset."""
    if settings.kafka.bootstrap_servers:
        return settings
    try:
        from bridgedev.kafka import SecureBrokerInfo, local_status
    except ModuleNotFoundError as exc:
        if not _is_dev_package(exc):
            raise
        raise UserError(
            "no Kafka configured: set BRIDGE_KAFKA__BOOTSTRAP_SERVERS (a local broker, "
            f"`bridge kafka start`, needs {DEV_INSTALL})"
        ) from None

    info = local_status(settings)
    if info is None:
        raise UserError(
            "no Kafka configured and no local broker running: set BRIDGE_KAFKA__BOOTSTRAP_SERVERS "
            "or run `bridge kafka start` first"
        )
    if isinstance(info, SecureBrokerInfo):
        raise UserError(
            "the local broker runs secured (SASL_SSL): pass its client settings with "
            f"`bridge --config {info.client_config} ...` (or BRIDGE_CONFIG_FILE)"
        )
    kafka = settings.kafka.model_copy(update={"bootstrap_servers": info.bootstrap_servers})
    return settings.model_copy(update={"kafka": kafka})


def require_kafka(
    settings: Settings, topics: Sequence[str] = (), hint: str = "", access: Access | None = None
) -> Settings:
    """``settings`` with a Kafka that answers and holds ``topics``; else :class:`KafkaUnavailable`.

    ``hint`` is a further way out when topics are missing (after `bridge topics create`).
    ``access``: what the command needs, named instead when a topic looks missing because the
    principal may not see it.
    """
    settings = with_kafka(settings)
    _check_answers(settings)
    _check_credentials(settings)
    present = asyncio.run(_topic_names(settings))
    missing = [topic for topic in topics if topic not in present]
    if missing:
        if access is not None:  # under ACLs, a topic the principal may not describe is not listed
            asyncio.run(_require_access(settings, access, absent_ok=True))
        raise KafkaUnavailable(
            f"topics missing on Kafka at {settings.kafka.bootstrap_servers}: "
            f"{_first_few(missing)}; run `bridge topics create`{hint}, or set "
            f"BRIDGE_TOPICS__PREFIX if they have another prefix (now {settings.topics.prefix!r})"
        )
    return settings


def _first_few(names: Sequence[str], few: int = 3) -> str:
    shown = ", ".join(names[:few])
    return shown if len(names) <= few else f"{shown} and {len(names) - few} more"


def _check_answers(settings: Settings) -> None:
    from bridge.kafka.probe import KafkaProviderError, check_bootstrap

    assert settings.kafka.bootstrap_servers is not None, "with_kafka filled it"
    try:
        check_bootstrap(settings.kafka.bootstrap_servers, settings.kafka.security_protocol)
    except KafkaProviderError as exc:
        raise KafkaUnavailable(str(exc)) from exc


def _check_credentials(settings: Settings) -> None:
    """TLS and SASL on one connection, so a refused certificate or password is named: the
    clients would only log it and give up with "unable to bootstrap"."""
    if settings.kafka.security_protocol == "PLAINTEXT":
        return  # nothing to check that the ApiVersions probe did not
    from bridge.kafka.clients import check_credentials
    from bridge.kafka.security import explain_connect_failure

    try:
        with _quiet("aiokafka"):
            asyncio.run(asyncio.wait_for(check_credentials(settings), KAFKA_METADATA_TIMEOUT_S))
    except TimeoutError as exc:
        raise KafkaUnavailable(
            f"Kafka at {settings.kafka.bootstrap_servers} did not complete the "
            f"{settings.kafka.security_protocol} handshake within {KAFKA_METADATA_TIMEOUT_S:g} s;"
            " check that BRIDGE_KAFKA__SECURITY_PROTOCOL matches its listener"
        ) from exc
    except Exception as exc:
        reason = explain_connect_failure(exc, settings)
        if reason is None:
            raise
        raise KafkaUnavailable(reason) from exc


async def _topic_names(settings: Settings) -> set[str]:
    """The cluster's topics: proves the clients can connect with the settings and get metadata."""
    from bridge.kafka.admin import topic_names
    from bridge.kafka.port import LogError

    protocol = settings.kafka.security_protocol
    try:
        with _quiet("aiokafka"):  # its retry logs would bury the one line that explains
            return await topic_names(settings, KAFKA_METADATA_TIMEOUT_S)
    except (LogError, TimeoutError) as exc:
        reason = str(exc) or f"no metadata within {KAFKA_METADATA_TIMEOUT_S:g} s"
        raise KafkaUnavailable(
            f"Kafka at {settings.kafka.bootstrap_servers} answers, but its metadata could not "
            f"be read ({reason}); check that BRIDGE_KAFKA__SECURITY_PROTOCOL ({protocol}) "
            "matches its listener and that its advertised listeners are reachable from here"
        ) from exc


def require_access(settings: Settings, access: Access) -> None:
    """The settings' principal holds every ACL of ``access`` and its topics exist; else
    :class:`KafkaUnavailable` naming the missing ACLs (a missing WRITE would otherwise show only
    at the first write)."""
    asyncio.run(_require_access(settings, access))


async def _require_access(settings: Settings, access: Access, *, absent_ok: bool = False) -> None:
    from bridge.kafka.acls import AccessDenied, check_access
    from bridge.kafka.topics import TopicLayoutError

    try:
        with _quiet("aiokafka"):
            async with asyncio.timeout(KAFKA_ACCESS_TIMEOUT_S):
                await check_access(settings, access)
    except AccessDenied as exc:
        raise KafkaUnavailable(str(exc)) from None
    except TopicLayoutError as exc:
        if not absent_ok:
            raise KafkaUnavailable(str(exc)) from None
    except TimeoutError:
        raise KafkaUnavailable(
            f"Kafka at {settings.kafka.bootstrap_servers} did not say within "
            f"{KAFKA_ACCESS_TIMEOUT_S:g} s what the principal may do"
        ) from None


@contextlib.contextmanager
def denials_explained(settings: Settings, access: Access) -> Iterator[None]:
    """A Kafka authorization refusal in the block (a client's, while it starts or runs) becomes
    one line naming the ACLs of ``access`` it concerns."""
    from bridge.kafka.acls import AccessDenied, refusals_explained

    try:
        with refusals_explained(access, settings):
            yield
    except AccessDenied as exc:
        raise KafkaUnavailable(str(exc)) from None


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


# --- kafka -----------------------------------------------------------------------------------


def cmd_kafka(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    with development_tooling("the local Kafka broker (`bridge kafka`)"):
        from bridgedev import kafka as broker

    if args.write_config and not (args.action == "start" and args.secure):
        raise UserError("--write-config goes with `bridge kafka start --secure`")
    if args.action == "stop":
        stopped = broker.stop_local_detached(settings)
        print("kafka stopped" if stopped else "no local kafka was running")
        return 0
    if args.action == "start":
        config = Path(args.write_config) if args.write_config else None
        info = broker.start_local_detached(
            settings, progress=_progress, secure=args.secure, client_config=config
        )
    else:
        status = broker.local_status(settings)
        if status is None:
            print("no local kafka running")
            return 1
        info = status
    print(f"kafka running ({info.provider}): {info.bootstrap_servers}  {info.detail}")
    if isinstance(info, broker.SecureBrokerInfo) and info.client_config is not None:
        print(
            f"secured: SASL_SSL, user {info.admin_user} (SCRAM-SHA-512); client settings in "
            f"{info.client_config}: bridge --config {info.client_config} <command>"
        )
    return 0


# --- topics ----------------------------------------------------------------------------------


def catalog_job_topics(settings: Settings) -> list[str]:
    """The job topics of the tools the bridge serves."""
    from bridge.tasks.tools import job_topics

    return job_topics(settings)


def require_tool_topics(settings: Settings, access: Access | None = None) -> None:
    """Every tool's job topic exists and this principal may describe it; else
    :class:`KafkaUnavailable` naming the first tools and their topics (or, under ACLs, the ACL
    that hides a topic). Without it a tools/call would wait for the topic's metadata for a
    minute and then fail its task."""
    from bridge.tasks.tools import tool_catalog

    present = asyncio.run(_topic_names(settings))
    declared = {tool.name for tool in settings.tools}
    missing = [
        (tool.name, topic)
        for tool in tool_catalog(settings)
        if (topic := tool.job_topic or settings.topics.jobs(tool.name)) not in present
    ]
    if not missing:
        return
    if access is not None:  # under ACLs, a topic the principal may not describe is not listed
        asyncio.run(_require_access(settings, access, absent_ok=True))
    name, topic = missing[0]
    where = "declared in the settings" if name in declared else "of a tool pack"
    more = f" (and {len(missing) - 1} more tools)" if len(missing) > 1 else ""
    raise KafkaUnavailable(
        f"tool {name!r} ({where}): its job topic {topic!r} does not exist on Kafka at "
        f"{settings.kafka.bootstrap_servers}, or this principal may not describe it{more}; "
        "create it (`bridge topics create`, or the pipeline's own tooling), correct the tool's "
        "job_topic, or set BRIDGE_TOPICS__AUTO_CREATE=true"
    )


def layout_topics(settings: Settings) -> list[str]:
    """Every topic `bridge topics create` makes: what `bridge serve` needs."""
    from bridge.kafka.topics import topic_layout

    return [spec.name for spec in topic_layout(settings, catalog_job_topics(settings))]


async def ensure_layout(settings: Settings, job_topics: Iterable[str]) -> list[TopicReport]:
    """Create/check the topic layout with ``job_topics``; refusals become a :class:`UserError`."""
    from bridge.kafka.adapter import CLIENT_ERRORS
    from bridge.kafka.topics import TopicLayoutError, create_layout

    try:
        with _quiet("aiokafka"):  # its connection logs would bury the one line that explains
            return await create_layout(settings, job_topics)
    except TopicLayoutError as exc:
        raise UserError(str(exc)) from None
    except CLIENT_ERRORS as exc:  # e.g. a replication factor above the number of brokers
        from bridge.kafka.acls import DOC, is_refusal

        if is_refusal(exc):
            raise KafkaUnavailable(
                f"Kafka at {settings.kafka.bootstrap_servers} does not let this principal create "
                f"or check the topic layout ({exc}); under ACLs an operator creates the topics "
                f"(`bridge topics create` as an admin) and the bridge runs with "
                f"BRIDGE_TOPICS__AUTO_CREATE=false ({DOC})"
            ) from exc
        raise UserError(
            f"Kafka at {settings.kafka.bootstrap_servers} refused the topic layout: {exc}"
        ) from exc


async def create_topics(settings: Settings) -> list[str]:
    """Create/check the topic layout; returns one line per topic."""
    reports = await ensure_layout(settings, catalog_job_topics(settings))
    return [report.describe() for report in reports]


def cmd_topics(args: argparse.Namespace, settings: Settings) -> int:
    for line in asyncio.run(create_topics(require_kafka(settings))):
        print(line)
    return 0


# --- the log ---------------------------------------------------------------------------------


def _log_topics(settings: Settings) -> list[str]:
    """The topics the indexer reads and writes."""
    return [settings.topics.events, settings.topics.index]


def cmd_index(args: argparse.Namespace, settings: Settings) -> int:
    """``bridge index migrate``: rewrite an index of an older layout (bridge.log.migrate)."""
    from bridge.kafka.acls import Access
    from bridge.log.migrate import migrate_index

    access = Access(("server",))
    checked = require_kafka(settings, _log_topics(settings), access=access)
    require_access(checked, access)
    with denials_explained(checked, access):
        report = asyncio.run(migrate_index(checked, progress=_progress))
    print(
        f"index migrated: {report.records_read} records read, {report.rewritten} rewritten, "
        f"{report.tombstoned} moved out of another partition, {report.partitions_added} "
        "partitions added"
        if report.rewritten or report.partitions_added
        else f"index already in the current layout ({report.records_read} records)"
    )
    return 0


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    from bridge.kafka.acls import Access, Operation
    from bridge.log.indexer import IndexerError
    from bridge.log.verify import verify_index

    access = Access(("server",), only=frozenset({Operation.READ}))  # it only reads
    try:
        checked = require_kafka(settings, _log_topics(settings), access=access)
        require_access(checked, access)
        with denials_explained(checked, access):
            report = asyncio.run(verify_index(checked, progress=_progress))
    except IndexerError as exc:
        raise UserError(str(exc)) from None
    for line in report.mismatches:
        print(f"MISMATCH {line}")
    verdict = "OK" if report.ok else f"{len(report.mismatches)} MISMATCHES"
    print(
        f"verify: {verdict}: {report.tasks_checked} tasks in {report.partitions} partitions, "
        f"{report.records_read} records re-read"
    )
    return 0 if report.ok else 1


# --- serve -----------------------------------------------------------------------------------


def serve(settings: Settings, *, with_workers: bool = False) -> None:
    """Run the HTTP server until SIGINT/SIGTERM; streams are drained first (clients resume)."""
    from bridge.server.runner import bridge_server
    from bridge.workers.inprocess import run_workers_in_process

    companions = [run_workers_in_process] if with_workers else []
    bridge_server(settings, companions=companions).run()


def require_keyring(settings: Settings) -> None:
    """The task identity keyring can be had (configured, derived, or the development key made
    now); else :class:`UserError` naming the setting."""
    from bridge.log.identity import load_keyring

    try:
        load_keyring(settings)
    except KeyringError as exc:
        raise UserError(str(exc)) from None


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from bridge.kafka.acls import Access
    from bridge.server.auth import unauthenticated_exposure

    exposure = unauthenticated_exposure(settings)
    if exposure is not None:  # before Kafka: one line and the exit
        raise UserError(exposure)
    access = Access.serving(settings, catalog_job_topics(settings), workers=args.with_workers)
    if settings.topics.auto_create:
        settings = require_kafka(settings)
        asyncio.run(create_topics(settings))
    else:
        hint = ", or set BRIDGE_TOPICS__AUTO_CREATE=true"
        jobs = set(catalog_job_topics(settings))
        core = [topic for topic in layout_topics(settings) if topic not in jobs]
        settings = require_kafka(settings, core, hint, access)
        require_tool_topics(settings, access)
    # Before uvicorn starts: a refusal is then this one line and the exit, never a ready replica.
    require_access(settings, access)
    require_keyring(settings)
    serve(settings, with_workers=args.with_workers)
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    """The reviewer demo (bridgedev/demo/): Kafka, topics, the bridge, a narrated walkthrough."""
    with development_tooling("the demo (`bridge demo`)"):
        from bridgedev.demo import DemoError, demo_command
        from bridgedev.replay import ReplayError

    try:
        return demo_command(
            settings,
            exit_after=args.exit,
            speed=args.speed,
            data=args.data,
            progress=_progress,
            create_topics=create_topics,
        )
    except (DemoError, ReplayError) as exc:
        raise UserError(str(exc)) from None


# --- replay ----------------------------------------------------------------------------------


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    with development_tooling("loading a recorded session (`bridge replay`)"):
        from bridgedev.replay import ReplayError, replay_command

    url = args.url or f"http://{settings.server.host}:{settings.server.port}/mcp"
    try:
        return asyncio.run(
            replay_command(
                require_kafka(settings, [settings.topics.events]),
                args.file,
                task_id=args.task_id,
                speed=args.speed,
                url=url,
                keep_open=args.keep_open,
                progress=_progress,
                principal=args.principal,
            )
        )
    except ReplayError as exc:
        raise UserError(str(exc)) from None


# --- tail ------------------------------------------------------------------------------------


def _summary(payload: dict[str, Any], width: int = 100) -> str:
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 1] + "…"


async def run_tail(
    url: str, task_id: str, after: int | None, token: str | None, cursor_file: str | None
) -> int:
    from bridge.client import (
        EventsGone,
        FileCursorStore,
        MemoryCursorStore,
        StreamError,
        TaskStreamClient,
    )

    store = FileCursorStore(cursor_file) if cursor_file else MemoryCursorStore()
    client = TaskStreamClient(url, token=token, store=store)
    try:
        await _reach(client, url, task_id)
        async for event in client.stream(task_id, after):
            print(f"{event.seq:>6}  {event.type:<40}  {_summary(event.payload)}", flush=True)
            store.save(task_id, event.seq)  # printed = processed: a resume starts after it
    except EventsGone as exc:
        print(
            f"events_gone: the cursor is older than what is retained; earliest seq is "
            f"{exc.earliest_seq} (resume with --after {exc.earliest_seq - 1})",
            file=sys.stderr,
        )
        return 3
    except StreamError as exc:
        raise UserError(f"the server refused the stream: {exc}") from None
    print("-- end of stream (the task is finished)", file=sys.stderr)
    return 0


async def _reach(client: TaskStreamClient, url: str, task_id: str) -> None:
    """One tasks/get first: the stream retries a connection for minutes, this fails at once
    (a retriable answer, as a replica being replaced gives, is retried with the back-off)."""
    import httpx

    try:
        await client.call_retrying("tasks/get", {"taskId": task_id}, task_id)
    except httpx.TransportError as exc:
        reason = str(exc) or type(exc).__name__
        raise UserError(
            f"cannot reach the bridge at {url} ({reason}); pass --url, or set BRIDGE_SERVER__HOST "
            "and BRIDGE_SERVER__PORT to where `bridge serve` listens"
        ) from exc


def cmd_tail(args: argparse.Namespace, settings: Settings) -> int:
    url = args.url or f"http://{settings.server.host}:{settings.server.port}/mcp"
    try:
        token = args.token or (
            settings.client.token.get_secret_value() if settings.client.token else None
        )
        return asyncio.run(run_tail(url, args.task_id, args.after, token, args.cursor_file))
    except OSError as exc:
        raise UserError(f"cannot reach {url}: {exc}") from None


# --- workers ---------------------------------------------------------------------------------


async def run_workers(
    settings: Settings, packs: list[str], concurrency: int, session_timeout_ms: int | None
) -> None:
    """Run the handlers of ``packs`` until SIGINT/SIGTERM; jobs in flight then go to others."""
    from bridge import tracing
    from bridge.component import cancel_and_wait, stop_signal
    from bridge.kafka.acls import Access
    from bridge.workers.packs import UnknownPack, pack_handlers, pack_tools
    from bridge.workers.sdk import Worker

    try:
        handlers = pack_handlers(packs)
        specs = pack_tools(packs)
    except (UnknownPack, ValueError) as exc:
        raise UserError(str(exc)) from None
    job_topics = {s.name: s.job_topic or settings.topics.jobs(s.name) for s in specs}
    access = Access(("worker",), tuple(job_topics.values()))
    if settings.topics.auto_create:  # under ACLs an operator creates them (no CREATE here)
        # The job topics must exist before the group subscribes: a consumer notices topics
        # created later only at its next metadata refresh (minutes).
        await ensure_layout(settings, job_topics.values())
    await _require_access(settings, access)

    stop = stop_signal()
    worker = Worker(
        settings,
        handlers,
        concurrency=concurrency,
        job_topics=job_topics,
        session_timeout_ms=session_timeout_ms,
    )
    with denials_explained(settings, access), tracing.installed(settings):
        async with worker:
            runner = asyncio.create_task(worker.run(), name="worker-run")
            stopping = asyncio.create_task(stop.wait())
            print(
                f"workers running: packs {', '.join(packs)}; {len(handlers)} tools; group "
                f"{worker.group_id}; concurrency {concurrency}",
                flush=True,
            )
            await asyncio.wait({runner, stopping}, return_when=asyncio.FIRST_COMPLETED)
            await cancel_and_wait(stopping)
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner  # re-raises if the worker itself failed
    print(f"workers stopped after {worker.completed} jobs", flush=True)


def cmd_workers(args: argparse.Namespace, settings: Settings) -> int:
    if args.concurrency < 1:
        raise UserError("--concurrency must be at least 1")
    packs = args.pack or settings.tool_packs
    if not packs:
        raise UserError(
            "no worker packs to run: pass --pack NAME (built in: conformance, demo) or set "
            "BRIDGE_TOOL_PACKS"
        )
    settings = require_kafka(settings)
    asyncio.run(run_workers(settings, packs, args.concurrency, args.session_timeout_ms))
    return 0


def cmd_webhooks(args: argparse.Namespace, settings: Settings) -> int:
    """``bridge webhooks new-key [FILE]``: add a fresh key to the key file that seals webhook
    secrets (created if absent) and make it current; the older keys stay for what they sealed."""
    from bridge.sealing import KeyFileError, KeyRing

    path = Path(args.file) if args.file else settings.webhooks.keys.file
    if path is None:
        raise UserError(
            "name the key file: bridge webhooks new-key FILE (or BRIDGE_WEBHOOKS__KEYS__FILE)"
        )
    try:
        ring = KeyRing.with_new_key(path)
    except KeyFileError as exc:
        raise UserError(str(exc)) from None
    print(f"{path}: current key {ring.current} ({len(ring.keys)} keys); roll every replica")
    return 0


# --- entry point -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bridge", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="TOML settings file (else $BRIDGE_CONFIG_FILE)")
    sub = parser.add_subparsers(dest="command", required=True)

    kafka = sub.add_parser("kafka", help="the embedded local Kafka broker (development install)")
    kafka.add_argument("action", choices=["start", "stop", "status"])
    kafka.add_argument(
        "--secure",
        action="store_true",
        help="start a SASL_SSL broker under ACLs (development only) and write its client settings",
    )
    kafka.add_argument(
        "--write-config",
        metavar="PATH",
        help="with start --secure: the client settings file (default: STATE_DIR/secure-client.toml)",
    )
    kafka.set_defaults(func=cmd_kafka)

    topics = sub.add_parser("topics", help="the topic layout")
    topics.add_argument("action", choices=["create"])
    topics.set_defaults(func=cmd_topics)

    index = sub.add_parser(
        "index", help="the seq index (each serving replica writes its own partitions' share)"
    )
    index.add_argument(
        "action",
        choices=["migrate"],
        help="migrate: rewrite an index of an older layout (stop every bridge process first)",
    )
    index.set_defaults(func=cmd_index)

    verify = sub.add_parser(
        "verify", help="re-derive seq from the retained log and compare with the index"
    )
    verify.set_defaults(func=cmd_verify)

    tail = sub.add_parser("tail", help="print a task's event timeline live (tasks/stream)")
    tail.add_argument("task_id")
    tail.add_argument("--after", type=int, help="resume after this seq (exclusive)")
    tail.add_argument("--url", help="the MCP endpoint (default: http://HTTP_HOST:HTTP_PORT/mcp)")
    tail.add_argument(
        "--token", help="bearer token (better: BRIDGE_CLIENT__TOKEN, not visible in ps)"
    )
    tail.add_argument(
        "--cursor-file", help="persist the last processed seq here and resume from it"
    )
    tail.set_defaults(func=cmd_tail)

    serve_p = sub.add_parser("serve", help="run the bridge's HTTP server")
    serve_p.add_argument(
        "--with-workers", action="store_true", help="also run the packs' workers in-process"
    )
    serve_p.add_argument("--host")
    serve_p.add_argument("--port", type=int)
    serve_p.set_defaults(func=cmd_serve)

    demo = sub.add_parser(
        "demo", help="local Kafka + topics + server: the reviewer demo (development install)"
    )
    demo.add_argument("--host")
    demo.add_argument("--port", type=int)
    demo.add_argument("--exit", action="store_true", help="exit after the walkthrough")
    demo.add_argument("--speed", type=float, default=20.0, help="replay pacing (default 20x)")
    demo.add_argument("--data", help="session file (default: data/agent-session.jsonl)")
    demo.set_defaults(func=cmd_demo)

    replay = sub.add_parser(
        "replay", help="load a recorded session into Kafka as a task's events (development install)"
    )
    replay.add_argument("file", help="JSON lines {offset_ms, type, payload} (see data/README.md)")
    target = replay.add_mutually_exclusive_group()
    target.add_argument("--task-id", help="append to this existing, unfinished task")
    target.add_argument(
        "--new", action="store_true", help="create a new task (the default); prints its id"
    )
    replay.add_argument(
        "--speed", type=float, default=1.0, help="x the recorded pacing; 0 = at once (default 1)"
    )
    replay.add_argument("--url", help="the bridge's MCP endpoint (checks --task-id; tail hint)")
    replay.add_argument(
        "--keep-open", action="store_true", help="no terminal status at the end: append later"
    )
    replay.add_argument(
        "--principal", default="anonymous", help="owner of a new task (auth mode none: anonymous)"
    )
    replay.set_defaults(func=cmd_replay)

    workers = sub.add_parser("workers", help="run the tool jobs of built-in worker packs")
    workers.add_argument(
        "--pack", action="append", help="a pack to run (repeatable; default: settings.tool_packs)"
    )
    workers.add_argument("--concurrency", type=int, default=32, help="jobs run at once")
    workers.add_argument(
        "--session-timeout-ms",
        type=int,
        help="consumer group session timeout: how soon a dead worker's jobs move to others",
    )
    workers.set_defaults(func=cmd_workers)

    webhooks = sub.add_parser("webhooks", help="the key that seals webhook secrets at rest")
    webhooks.add_argument(
        "action",
        choices=["new-key"],
        help="new-key: add a fresh current key to the key file (created if absent)",
    )
    webhooks.add_argument("file", nargs="?", help="the key file (default: webhooks.keys.file)")
    webhooks.set_defaults(func=cmd_webhooks)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    prog = " ".join(["bridge", args.command, *([args.action] if "action" in args else [])])
    server: dict[str, Any] = {}
    if getattr(args, "host", None):
        server["host"] = args.host
    if getattr(args, "port", None) is not None:
        server["port"] = args.port
    overrides: dict[str, Any] = {"server": server} if server else {}
    try:
        settings = load_settings(args.config, **overrides)
    except ValueError as exc:
        print(f"{prog}: bad settings: {_one_line_settings_error(exc)}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    func: Callable[[argparse.Namespace, Settings], int] = args.func
    try:
        return func(args, settings)
    except UserError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except KeyringError as exc:  # a command that signs or verifies task identities
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from bridge.kafka.probe import KafkaProviderError

        if isinstance(exc, KafkaProviderError):
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        raise


def configure_logging(level: str) -> None:
    """The process's logging: one format, ``level``, and aiokafka's expected start-up transients
    demoted from ERROR (:mod:`bridge.kafka.logs`)."""
    from bridge.kafka.logs import demote_startup_transients

    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    demote_startup_transients()


def _one_line_settings_error(exc: ValueError) -> str:
    """Each problem as ``where: what``, on one line (pydantic's text spans several)."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return str(exc)
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        what = error["msg"].removeprefix("Value error, ")
        problems.append(f"{where}: {what}" if where else what)
    return "; ".join(problems)


if __name__ == "__main__":
    sys.exit(main())
