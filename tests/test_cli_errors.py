"""The CLI against a Kafka it cannot use: one line on stderr naming the problem and the
setting to change, exit status 2, no traceback, within seconds (subprocess runs of `bridge`)."""

from __future__ import annotations

import os
import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bridge.config import Settings

SESSION = Path(__file__).resolve().parent.parent / "data" / "agent-session.jsonl"
BOUND_S = 20.0  # a misconfiguration must be reported within this many seconds

#: Every command that needs Kafka, as typed after `bridge` (and as named in its error line).
COMMANDS = {
    "serve": ["serve", "--port", "0"],
    "index migrate": ["index", "migrate"],
    "workers": ["workers", "--pack", "conformance"],  # no packs by default: nothing to run
    "verify": ["verify"],
    "topics create": ["topics", "create"],
    "replay": ["replay", str(SESSION), "--speed", "0"],
}
#: The one command that talks to the bridge, not to Kafka.
TAIL = ["tail", "task-1", "--url", "http://127.0.0.1:1/mcp"]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def error_line(self) -> str:
        """The only line on stderr (fails the test if there are more)."""
        lines = self.stderr.strip().splitlines()
        assert len(lines) == 1, self.stderr
        return lines[0]


def run_bridge(command: str, bootstrap: str, *args: str, **env: str) -> Run:
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("BRIDGE_", "KAFKA_BOOTSTRAP"))
    }
    environ.update(BRIDGE_KAFKA__BOOTSTRAP_SERVERS=bootstrap, PYTHONUNBUFFERED="1", **env)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "bridge.cli", *(args or COMMANDS[command])],
        env=environ,
        capture_output=True,
        text=True,
        timeout=3 * BOUND_S,  # the assertion below is the real bound; this only stops a hang
        stdin=subprocess.DEVNULL,
    )
    return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def assert_one_clear_line(run: Run, command: str, *needles: str) -> None:
    assert "Traceback" not in run.stdout + run.stderr, run.stderr
    line = run.error_line
    assert line.startswith(f"bridge {command}: "), line
    for needle in needles:
        assert needle in line, line
    assert run.returncode == 2, run.stderr
    assert run.seconds < BOUND_S, f"took {run.seconds:.1f} s"


@pytest.mark.parametrize("command", COMMANDS)
def test_a_refused_port_is_one_line_naming_the_bootstrap_setting(command: str) -> None:
    run = run_bridge(command, "127.0.0.1:1")  # nothing listens on port 1 without root
    assert_one_clear_line(run, command, "connection refused", "BRIDGE_KAFKA__BOOTSTRAP_SERVERS")


@pytest.mark.parametrize("command", ["serve", "index migrate", "replay"])
def test_an_unresolvable_host_is_one_line_naming_the_bootstrap_setting(command: str) -> None:
    run = run_bridge(command, "kafka.invalid:9092")  # .invalid never resolves (RFC 2606)
    assert_one_clear_line(run, command, "cannot resolve", "BRIDGE_KAFKA__BOOTSTRAP_SERVERS")


def listening(handler: type[socketserver.BaseRequestHandler]) -> Iterator[int]:
    """The port of a local TCP server answering with ``handler``, for as long as it is used."""
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield int(server.server_address[1])
        finally:
            server.shutdown()


@pytest.fixture
def http_listener() -> Iterator[int]:
    """A port where an HTTP server, not Kafka, answers whatever it is sent."""

    class Answer(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.recv(4096)
            self.request.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    yield from listening(Answer)


def test_a_port_that_is_not_kafka_is_one_line_naming_the_bootstrap_setting(
    http_listener: int,
) -> None:
    run = run_bridge("serve", f"127.0.0.1:{http_listener}")
    assert_one_clear_line(run, "serve", "not a Kafka answer", "BRIDGE_KAFKA__BOOTSTRAP_SERVERS")


@pytest.fixture
def apiversions_only_listener() -> Iterator[int]:
    """A port that answers Kafka's ApiVersions and then hangs up, as a SASL listener does for
    a client that does not authenticate: the probe passes, the clients get no metadata."""

    class Answer(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            size = struct.unpack(">i", self.request.recv(4))[0]
            api_key, _version, correlation_id = struct.unpack(">hhi", self.request.recv(size)[:8])
            if api_key == 18:  # ApiVersions v0: no error; Metadata and ApiVersions listed
                apis = struct.pack(">hhhhhh", 3, 0, 9, 18, 0, 3)
                answer = struct.pack(">ihi", correlation_id, 0, 2) + apis
                self.request.sendall(struct.pack(">i", len(answer)) + answer)

    yield from listening(Answer)


@pytest.mark.parametrize("command", ["serve", "topics create"])
def test_a_listener_that_gives_no_metadata_is_one_line_naming_the_protocol_setting(
    command: str, apiversions_only_listener: int
) -> None:
    run = run_bridge(command, f"127.0.0.1:{apiversions_only_listener}")
    assert_one_clear_line(run, command, "metadata", "BRIDGE_KAFKA__SECURITY_PROTOCOL")


def test_tail_of_an_unreachable_bridge_is_one_line_naming_the_url_option() -> None:
    run = run_bridge("tail", "127.0.0.1:1", *TAIL)
    assert_one_clear_line(run, "tail", "cannot reach the bridge", "--url")


@pytest.mark.kafka
@pytest.mark.parametrize("command", ["serve", "index migrate", "verify", "replay"])
def test_missing_topics_are_one_line_naming_them_and_how_to_create_them(
    command: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    run = run_bridge(
        command,
        kafka_bootstrap,
        BRIDGE_TOPICS__PREFIX=topic_prefix,
        BRIDGE_TOPICS__AUTO_CREATE="false",
    )
    needles = [f"{topic_prefix}.task-events", "bridge topics create", "BRIDGE_TOPICS__PREFIX"]
    if command == "serve":
        needles.append("BRIDGE_TOPICS__AUTO_CREATE")
    assert_one_clear_line(run, command, *needles)


@pytest.mark.kafka
@pytest.mark.parametrize("protocol", ["SSL", "SASL_PLAINTEXT"])
def test_a_security_protocol_the_clients_cannot_use_is_one_line_naming_the_setting(
    protocol: str, kafka_bootstrap: str, topic_prefix: str
) -> None:
    run = run_bridge(
        "serve",
        kafka_bootstrap,
        BRIDGE_TOPICS__PREFIX=topic_prefix,
        BRIDGE_KAFKA__SECURITY_PROTOCOL=protocol,
    )
    assert_one_clear_line(run, "serve", f"BRIDGE_KAFKA__SECURITY_PROTOCOL={protocol}")


@pytest.mark.kafka
def test_a_declared_tool_whose_job_topic_is_missing_is_one_line_naming_tool_and_topic(
    topics: Settings,
) -> None:
    """examples/pipeline-tool.toml declares java_count; its job topic was never created."""
    example = Path(__file__).resolve().parent.parent / "examples" / "pipeline-tool.toml"
    prefix = topics.topics.prefix
    run = run_bridge(
        "serve",
        topics.kafka.bootstrap_servers or "",
        BRIDGE_CONFIG_FILE=str(example),
        BRIDGE_TOPICS__PREFIX=prefix,
        BRIDGE_TOPICS__AUTO_CREATE="false",
    )
    assert_one_clear_line(
        run,
        "serve",
        "tool 'java_count' (declared in the settings)",
        f"job topic '{prefix}.jobs.java_count' does not exist",
        "BRIDGE_TOPICS__AUTO_CREATE=true",
    )
