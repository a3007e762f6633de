"""What a newcomer meets first: ``bridge --help``, the demo's log while Kafka's group
coordinator starts, and the docs' word for the Events extension's status (no broker)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest
from aiokafka.errors import GroupCoordinatorNotAvailableError, GroupLoadInProgressError, KafkaError
from support.imports import BRIDGE

from bridge.cli import build_parser, configure_logging
from bridge.kafka.logs import COORDINATOR_LOGGER, StartupTransients

ROOT = BRIDGE.parent


def test_help_names_what_the_commands_do_and_no_later() -> None:
    text = build_parser().format_help()
    assert "(later)" not in text and "``" not in text
    assert "tools around the log" in text


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


Logged = tuple[logging.Logger, Kept, Clock]


@pytest.fixture
def coordinator_log() -> Iterator[Logged]:
    """aiokafka's coordinator logger with a fresh filter on a fake clock, and what it emits."""
    logger = logging.getLogger(COORDINATOR_LOGGER)
    clock, kept = Clock(), Kept()
    demote = StartupTransients(60.0, clock)
    saved = logger.level, logger.propagate, list(logger.filters)
    logger.filters.clear()
    logger.addFilter(demote)
    logger.addHandler(kept)
    logger.propagate = False
    try:
        yield logger, kept, clock
    finally:
        logger.removeHandler(kept)
        logger.filters[:] = saved[2]
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def log_lookup_failure(logger: logging.Logger, error: Exception) -> None:
    """What aiokafka logs when a FindCoordinator fails (consumer/group_coordinator.py)."""
    logger.error("Group Coordinator Request failed: %s", error)


def test_the_coordinator_transient_at_start_is_info_not_error(coordinator_log: Logged) -> None:
    logger, kept, _ = coordinator_log
    logger.setLevel(logging.INFO)
    log_lookup_failure(logger, GroupCoordinatorNotAvailableError())
    log_lookup_failure(logger, GroupLoadInProgressError())
    assert [r.levelname for r in kept.records] == ["INFO", "INFO"]
    assert "expected while the group coordinator starts" in kept.records[0].getMessage()
    assert "GroupCoordinatorNotAvailableError" in kept.records[0].getMessage()


def test_with_warnings_only_the_transient_is_not_shown_at_all(coordinator_log: Logged) -> None:
    logger, kept, _ = coordinator_log
    logger.setLevel(logging.WARNING)  # the demo's narration shows warnings and errors only
    log_lookup_failure(logger, GroupCoordinatorNotAvailableError())
    assert kept.records == []


def test_other_errors_and_a_coordinator_missing_after_the_start_stay_errors(
    coordinator_log: Logged,
) -> None:
    logger, kept, clock = coordinator_log
    logger.setLevel(logging.INFO)
    log_lookup_failure(logger, KafkaError())
    logger.error("Heartbeat session expired - marking coordinator dead")
    log_lookup_failure(logger, GroupCoordinatorNotAvailableError())  # opens the window
    clock.now += 60.0
    log_lookup_failure(logger, GroupCoordinatorNotAvailableError())
    assert [r.levelname for r in kept.records] == ["ERROR", "ERROR", "INFO", "ERROR"]


def test_the_window_opens_at_the_first_lookup_not_at_the_process_start(
    coordinator_log: Logged,
) -> None:
    """A broker slow to come up (the demo starts its own; a pod may start before its Kafka)
    must not use up the window before the group even asks for its coordinator."""
    logger, kept, clock = coordinator_log
    logger.setLevel(logging.INFO)
    clock.now += 300.0  # the broker took five minutes to answer at all
    log_lookup_failure(logger, GroupCoordinatorNotAvailableError())
    clock.now += 59.0
    log_lookup_failure(logger, GroupLoadInProgressError())
    assert [r.levelname for r in kept.records] == ["INFO", "INFO"]


def test_the_command_line_installs_the_filter_once() -> None:
    logger = logging.getLogger(COORDINATOR_LOGGER)
    saved = list(logger.filters)
    try:
        configure_logging("INFO")
        configure_logging("INFO")
        assert sum(isinstance(f, StartupTransients) for f in logger.filters) == 1
    finally:
        logger.filters[:] = saved


def test_no_doc_calls_sep_3415_a_draft() -> None:
    """SEP-3415 is Final (the extension Beta): docs/events.md says which text it follows."""
    stale = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            about_events = re.search(r"3415|[Ee]vents [Ee]xtension", line)
            if re.search(r"\bdraft", line, re.IGNORECASE) and about_events:
                stale.append(f"{doc.relative_to(ROOT)}:{number}")
    for page in ("events.md", "demo.md"):  # the Events pages: no "draft" in any sense
        if re.search(r"\bdraft\b", (ROOT / "docs" / page).read_text(encoding="utf-8"), re.I):
            stale.append(f"docs/{page}")
    assert stale == []


def test_the_dockerfile_names_commands_and_files_that_exist() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    named = set(re.findall(r"`bridge (\w+)", text)) | set(re.findall(r"\(`(\w+)`", text))
    assert named and named <= commands, named - commands
    paths = re.findall(r"(?<![\w/])((?:k8s|bridge|schemas)/[\w./-]+\w)", text)
    assert paths and [p for p in paths if not (ROOT / p).exists()] == []
