"""Renamed settings: the one table from each flat name (0.1.0) to its place in the groups.

0.1.0 had some sixty settings side by side (``BRIDGE_STREAM_QUEUE_SIZE``, ``[kafka_tls]``);
they now live in groups by concern (``BRIDGE_STREAMS__QUEUE_SIZE``, ``[kafka.tls]``). The old
names keep working: :mod:`bridge.config` passes every source (environment, TOML file, keyword
arguments) through :func:`rename_keys` or :func:`rename_env`, which move a value from its old
name to its new place, log one deprecation warning per old name (never the value: some are
secrets), and refuse an old and a new name given together with different values.

This module knows names only; it never reads the environment itself (config does).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["RENAMED", "RenameConflict", "new_path", "rename_env", "rename_keys"]

log = logging.getLogger("bridge.config")

#: Old name (a top-level setting or group of 0.1.0) -> its new dotted path. A group moves with
#: everything under it (``kafka_tls.ca_file`` -> ``kafka.tls.ca_file``). docs/configuration.md
#: shows this table; bridgedev/rewrite_settings.py rewrites code with it.
RENAMED: dict[str, str] = {
    # kafka: the cluster and how to reach it
    "kafka_bootstrap_servers": "kafka.bootstrap_servers",
    "kafka_security_protocol": "kafka.security_protocol",
    "kafka_tls": "kafka.tls",
    "kafka_sasl": "kafka.sasl",
    "kafka_client_id": "kafka.client_id",
    "kafka_request_timeout_ms": "kafka.request_timeout_ms",
    "local_kafka": "kafka.local",
    # topics: the layout
    "auto_create_topics": "topics.auto_create",
    # tasks: the tasks and their events
    "event_type_prefix": "tasks.event_type_prefix",
    "accepted_event_prefixes": "tasks.accepted_event_prefixes",
    "max_event_bytes": "tasks.max_event_bytes",
    "checkpoint_interval": "tasks.checkpoint_interval",
    "max_active_tasks_per_principal": "tasks.max_active_per_principal",
    "direct_result_timeout_s": "tasks.direct_result_timeout_s",
    "control_lookback_ms": "tasks.control_lookback_ms",
    # server: the HTTP listener
    "http_host": "server.host",
    "http_port": "server.port",
    "server_loop": "server.loop",
    "server_http": "server.http",
    "server_read_timeout_s": "server.read_timeout_s",
    "server_max_head_bytes": "server.max_head_bytes",
    "server_keep_alive_s": "server.keep_alive_s",
    "gc_young_threshold": "server.gc_young_threshold",
    "allowed_hosts": "server.allowed_hosts",
    "allowed_origins": "server.allowed_origins",
    "max_request_bytes": "server.max_request_bytes",
    "metrics_refresh_s": "server.metrics_refresh_s",
    "admin_endpoints": "server.admin_endpoints",
    # streams: long-lived responses
    "max_streams_per_principal": "streams.max_per_principal",
    "max_stream_opens_per_minute": "streams.opens_per_minute",
    "max_streams": "streams.max_total",
    "stream_queue_size": "streams.queue_size",
    "stream_keepalive_s": "streams.keepalive_s",
    "cursor_catch_up_s": "streams.cursor_catch_up_s",
    # replicas: dividing the partitions; peers: the listener replicas forward to
    "ownership": "replicas.ownership",
    "instance_id": "replicas.instance_id",
    "group_session_timeout_ms": "replicas.session_timeout_ms",
    "owner_wait_s": "replicas.owner_wait_s",
    "advertised_url": "peers.advertised_url",
    "peer_secret": "peers.secret",
    "peer_secret_file": "peers.secret_file",
    # webhooks: the Events extension's push delivery
    "webhook_allowlist": "webhooks.allowlist",
    "webhook_ca_file": "webhooks.ca_file",
    "webhook_ttl_default_ms": "webhooks.ttl_default_ms",
    "webhook_ttl_min_ms": "webhooks.ttl_min_ms",
    "webhook_ttl_max_ms": "webhooks.ttl_max_ms",
    "webhook_max_subscriptions_per_principal": "webhooks.max_subscriptions_per_principal",
    "webhook_max_attempts": "webhooks.max_attempts",
    "webhook_max_retry_s": "webhooks.max_retry_s",
    "webhook_backoff_base_s": "webhooks.backoff_base_s",
    "webhook_backoff_max_s": "webhooks.backoff_max_s",
    "webhook_timeout_s": "webhooks.timeout_s",
    "webhook_poll_interval_s": "webhooks.poll_interval_s",
    "webhook_suspend_after_failures": "webhooks.suspend_after_failures",
    "webhook_rotation_grace_s": "webhooks.rotation_grace_s",
    "webhook_verify_burst": "webhooks.verify_burst",
    "webhook_verify_per_minute": "webhooks.verify_per_minute",
    "webhook_verify_principal_burst": "webhooks.verify_principal_burst",
    "webhook_verify_principal_per_minute": "webhooks.verify_principal_per_minute",
    "webhook_keys": "webhooks.keys",
    # events: the Events extension
    "event_cursors": "events.cursors",
    "event_sources": "events.sources",
    # view: the browser view
    "view_enabled": "view.enabled",
    "view_token_ttl_s": "view.token_ttl_s",
    "view_token_secret": "view.token_secret",
    "view_token_secret_file": "view.token_secret_file",
    "view_retry_ms": "view.retry_ms",
    # canary
    "canary_interval_s": "canary.interval_s",
    "canary_timeout_s": "canary.timeout_s",
    "canary_task_ttl_s": "canary.task_ttl_s",
    # client: what the bridge's own clients (bridge tail) present
    "client_token": "client.token",
}


class RenameConflict(ValueError):
    """An old and a new name of one setting were both given, with different values."""


def new_path(old: str) -> str | None:
    """The new dotted path of an old dotted path (``kafka_tls.ca_file`` -> ``kafka.tls.ca_file``),
    or None when nothing under it was renamed."""
    head, dot, rest = old.partition(".")
    moved = RENAMED.get(head)
    if moved is None:
        return None
    return moved + dot + rest


def _warn(old: str, new: str) -> None:
    # The names only: the value may be a password.
    log.warning("setting %s is deprecated: use %s (docs/configuration.md)", old, new)


def rename_keys(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``values`` (a TOML document or keyword arguments) with every old top-level key moved to
    its new nested place. ``where`` names the source in the conflict error.

    A group given under its new name and its fields under old names merge; the same field under
    both names with different values raises :class:`RenameConflict` naming both.
    """
    out = {key: value for key, value in values.items() if key not in RENAMED}
    for old in sorted(key for key in values if key in RENAMED):
        new = RENAMED[old]
        *parents, leaf = new.split(".")
        target = _group(out, parents)
        if target is None or (leaf in target and target[leaf] != values[old]):
            raise RenameConflict(
                f"{where}: {old} and {new} are the same setting (renamed) and both are given, "
                f"differently: keep {new} only"
            )
        target[leaf] = values[old]
        _warn(f"{where} {old}", new)
    return out


def _group(values: dict[str, Any], path: list[str]) -> dict[str, Any] | None:
    # The dict at ``path``, made (or copied: never the caller's) on the way; None where a whole
    # model stands instead, which a field under an old name cannot merge into.
    for part in path:
        nested = values.get(part, {})
        if not isinstance(nested, dict):
            return None
        values[part] = nested = dict(nested)
        values = nested
    return values


def _env(path: str, prefix: str) -> str:
    return prefix + "__".join(path.split("."))


def rename_env(env: Mapping[str, str | None], prefix: str = "bridge_") -> dict[str, str | None]:
    """Environment variables (names lower case, as pydantic-settings reads them) with every old
    name (``bridge_kafka_tls__ca_file``) under its new one (``bridge_kafka__tls__ca_file``)."""
    out = dict(env)
    for name in _old_names(env, prefix):
        old = name[len(prefix) :]
        head, sep, rest = old.partition("__")
        new_name = _env(RENAMED[head], prefix) + sep + rest
        value = out.pop(name)
        if new_name in env and env[new_name] != value:
            raise RenameConflict(
                f"{name.upper()} and {new_name.upper()} are the same setting (renamed) and both "
                f"are given, differently: keep {new_name.upper()} only"
            )
        nested = _nested(env, new_name)
        if nested is not None:
            raise RenameConflict(
                f"{name.upper()} and {nested.upper()} both set {new_name.upper()} (renamed), one "
                f"as a whole group and one field by field: keep {nested.upper()} only"
            )
        out[new_name] = value
        _warn(name.upper(), new_name.upper())
    return out


def _nested(env: Mapping[str, str | None], new_name: str) -> str | None:
    """A name of ``env`` that sets part of ``new_name`` or a group around it (values at
    different depths cannot be compared, and the renamed one would silently win)."""
    parts = new_name.split("__")
    for depth in range(1, len(parts)):
        around = "__".join(parts[:depth])
        if around in env:
            return around
    deeper = new_name + "__"
    return next((name for name in env if name.startswith(deeper)), None)


def _old_names(env: Iterable[str], prefix: str) -> list[str]:
    return sorted(
        name
        for name in env
        if name.startswith(prefix) and name[len(prefix) :].partition("__")[0] in RENAMED
    )
