"""The Kafka jars from Maven Central, cached once per version, and the Java that runs them.

:func:`ensure_kafka_jars` resolves ``org.apache.kafka:kafka_2.13:<version>`` plus the log4j2
backend Kafka's metadata leaves out, with ``mvn`` into ``<cache_dir>/kafka-<version>/libs``.
It configures and starts no broker (that is :mod:`bridgedev.kafka.kraft` and the modules that
use it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from bridge.config import Settings
from bridgedev.kafka.broker import KafkaProviderError, Progress, _stderr_progress
from bridgedev.kafka.files import _abs, _tail_text, _write_atomic
from bridgedev.kafka.process import _file_lock

_MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
#: log4j2 version when the Kafka version brings none at runtime (4.0.x needs it to start).
_DEFAULT_LOG4J = "2.24.3"
_DEFAULT_SLF4J = "1.7.36"
_MAVEN_TIMEOUT_S = 900.0


def ensure_kafka_jars(settings: Settings, progress: Progress | None = None) -> Path:
    """The directory with every jar the broker needs, fetched with Maven on first use.

    ``<cache_dir>/kafka-<version>/libs``; ``complete.json`` beside it is written last, so a
    crashed fetch is redone; an ``fcntl`` lock serialises concurrent fetchers (the loser waits
    and then finds the jars complete).
    """
    say = progress or _stderr_progress
    version = settings.kafka.local.version
    home = _abs(settings.kafka.local.cache_dir) / f"kafka-{version}"
    libs = home / "libs"
    marker = home / "complete.json"
    if _jars_complete(libs, marker):
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaProviderError(
            "Maven (`mvn`) is not on PATH; it fetches the Kafka jars for the local broker. "
            "Install Maven (e.g. `apt-get install maven`) or point BRIDGE_KAFKA__BOOTSTRAP_SERVERS "
            "at a running cluster."
        )
    _java_command()  # a missing/old Java is worth knowing before a 100 MB download
    home.mkdir(parents=True, exist_ok=True)
    with _file_lock(home / ".fetch.lock", say, "another process is fetching the Kafka jars"):
        if _jars_complete(libs, marker):
            return libs
        marker.unlink(missing_ok=True)
        partial = home / "libs.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(libs, ignore_errors=True)
        say(f"fetching Kafka {version} jars with Maven into {libs} (first use only, ~45 MB)")
        started = time.monotonic()
        kafka_pom = home / "pom-kafka.xml"
        kafka_pom.write_text(
            _pom("kafka", [("org.apache.kafka", "kafka_2.13", version)]), encoding="utf-8"
        )
        _run_maven(mvn, kafka_pom, partial, transitive=True)
        if not (partial / f"kafka_2.13-{version}.jar").is_file():
            raise KafkaProviderError(f"Maven did not deliver kafka_2.13-{version}.jar to {partial}")
        logging_deps = _logging_dependencies(partial)
        log_pom = home / "pom-logging.xml"
        log_pom.write_text(_pom("logging", logging_deps), encoding="utf-8")
        _run_maven(mvn, log_pom, partial, transitive=False)
        jars = sorted(p.name for p in partial.glob("*.jar"))
        os.replace(partial, libs)
        _write_atomic(
            marker,
            json.dumps(
                {"version": version, "logging": [":".join(d) for d in logging_deps], "jars": jars},
                indent=1,
            ),
        )
        size = sum((libs / j).stat().st_size for j in jars)
        say(
            f"fetched {len(jars)} jars ({size / 2**20:.0f} MB) in {time.monotonic() - started:.1f} s"
        )
    return libs


def _jars_complete(libs: Path, marker: Path) -> bool:
    try:
        jars = json.loads(marker.read_text(encoding="utf-8"))["jars"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(jars) and all((libs / j).is_file() for j in jars)


def _logging_dependencies(libs: Path) -> list[tuple[str, str, str]]:
    """The log4j2 backend the resolved Kafka jars lack, matched to their slf4j and log4j.

    Kafka 4.x logs through slf4j-api 1.7.36 but ships no binding in its Maven metadata; 4.1+
    brings log4j-api/-core (via kafka-server), 4.0 none at all. The slf4j 1 binding is
    ``log4j-slf4j-impl``; an slf4j 2 API would need ``log4j-slf4j2-impl``.
    """
    slf4j = _jar_version(libs, "slf4j-api")
    log4j = _jar_version(libs, "log4j-core") or _jar_version(libs, "log4j-api") or _DEFAULT_LOG4J
    deps: list[tuple[str, str, str]] = []
    if slf4j is None:
        slf4j = _DEFAULT_SLF4J
        deps.append(("org.slf4j", "slf4j-api", slf4j))
    for artifact in ("log4j-api", "log4j-core"):
        if _jar_version(libs, artifact) is None:
            deps.append(("org.apache.logging.log4j", artifact, log4j))
    binding = "log4j-slf4j2-impl" if int(slf4j.split(".")[0]) >= 2 else "log4j-slf4j-impl"
    deps.append(("org.apache.logging.log4j", binding, log4j))
    return deps


def _jar_version(libs: Path, artifact: str) -> str | None:
    pattern = re.compile(rf"^{re.escape(artifact)}-(\d+\.\d+[^/]*)\.jar$")
    for jar in libs.glob(f"{artifact}-*.jar"):
        match = pattern.match(jar.name)
        if match:
            return match.group(1)
    return None


def _pom(name: str, deps: list[tuple[str, str, str]]) -> str:
    dependencies = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- generated by bridgedev.kafka.jars: the jars of the local Kafka broker -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.mcp-kafka-bridge</groupId>
  <artifactId>kafka-broker-{name}</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""


def _run_maven(mvn: str, pom: Path, out: Path, *, transitive: bool) -> None:
    cmd = [
        mvn,
        "-B",
        "-q",
        "-Dstyle.color=never",
        "-f",
        str(pom),
        f"{_MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={out}",
    ]
    if not transitive:
        cmd.append("-DexcludeTransitive=true")
    try:
        done = subprocess.run(
            cmd,
            cwd=pom.parent,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_MAVEN_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise KafkaProviderError(
            f"Maven did not finish fetching the Kafka jars within {_MAVEN_TIMEOUT_S:g} s: "
            f"{' '.join(cmd)}"
        ) from exc
    if done.returncode != 0:
        output = (done.stdout + done.stderr).decode("utf-8", "replace")
        raise KafkaProviderError(
            f"Maven failed (exit {done.returncode}) fetching the Kafka jars with "
            f"`{' '.join(cmd)}`; is Maven Central reachable and the version "
            f"right? Last lines:\n{_tail_text(output, 25)}"
        )


_JAVA: dict[str, str] = {}


def _java_command() -> str:
    """The ``java`` on PATH, checked once per process to be Java 17 or newer."""
    java = shutil.which("java")
    if java is None:
        raise KafkaProviderError(
            "Java (`java`) is not on PATH; the local Kafka broker needs Java 17+. Install a JDK "
            "(e.g. `apt-get install openjdk-17-jre-headless`) or set BRIDGE_KAFKA__BOOTSTRAP_SERVERS."
        )
    if java in _JAVA:
        return _JAVA[java]
    try:
        done = subprocess.run(
            [java, "-version"],
            capture_output=True,
            timeout=30,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KafkaProviderError(f"`{java} -version` failed: {exc}") from exc
    text = (done.stderr + done.stdout).decode("utf-8", "replace")
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        raise KafkaProviderError(f"cannot tell the Java version from `{java} -version`: {text!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # 1.8 style
        major = int(match.group(2))
    if major < 17:
        raise KafkaProviderError(
            f"{java} is Java {major}; Kafka 4 needs Java 17 or newer. Install a newer JDK or set "
            "BRIDGE_KAFKA__BOOTSTRAP_SERVERS to a running cluster."
        )
    _JAVA[java] = java
    return java
