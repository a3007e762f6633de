"""Settings: the one place that reads the environment.

Every tunable of the bridge lives on :class:`Settings`, in one group per concern (``kafka``,
``topics``, ``tasks``, ``server``, ``streams``, ``replicas``, ``peers``, ...; docs/configuration.md).
Values come, in order of precedence, from keyword arguments, ``BRIDGE_*`` environment variables
(``BRIDGE_<GROUP>__<FIELD>``), then an optional TOML file named by ``BRIDGE_CONFIG_FILE`` (or passed
explicitly; read by pydantic-settings' TOML source), then the defaults below.
``KAFKA_BOOTSTRAP_SERVERS`` is honoured as well, because it is the conventional way to point any
Kafka tool at a cluster. The flat names of 0.1.0 still load (:mod:`bridge.settings_renames`).

Nothing else in the package calls ``os.environ``; code that needs a setting takes a
``Settings`` (or one of its values) as an argument.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from functools import lru_cache
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import urlsplit

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from bridge.settings_renames import rename_env, rename_keys
from bridge.vocabulary import EventTypeRule, TaskEventTypes

__all__ = [
    "AuthSettings",
    "CanarySettings",
    "ClientSettings",
    "EventCursorSettings",
    "EventSourceSpec",
    "EventsSettings",
    "HandoverSettings",
    "IdentitySettings",
    "KafkaLocalSettings",
    "KafkaSaslSettings",
    "KafkaSettings",
    "KafkaTlsSettings",
    "PeerSettings",
    "ReplicaSettings",
    "ServerSettings",
    "Settings",
    "StreamSettings",
    "TasksSettings",
    "ToolSpec",
    "TopicSettings",
    "TracingSettings",
    "UpgradeSettings",
    "ViewSettings",
    "WebhookKeySettings",
    "WebhookSettings",
    "env_name",
    "load_settings",
    "running_in_ci",
]

_DEFAULT_CACHE = Path.home() / ".cache" / "mcp-kafka-bridge"


class TopicSettings(BaseModel):
    """The topic layout (docs/architecture.md): names derive from one prefix."""

    # Unknown keys refused: ``auto_create`` moved in here from the top level, where a misspelt
    # ``auto_create_topics`` was refused; a misspelt ``auto_create = false`` must not be ignored.
    model_config = ConfigDict(extra="forbid")

    prefix: str = Field("mcpbridge", pattern=r"^[A-Za-z0-9._-]{1,120}$")
    #: Partitions of the events topic; the index and updates topics are co-partitioned with it
    #: (a task's index and update records live in the partition number of its events).
    partitions: int = Field(6, ge=1, le=10_000)
    replication_factor: int = Field(1, ge=1, le=32)
    #: ``retention.ms`` of the events topic: the maximum event age (SEP-2694 "Event Retention").
    retention_ms: int = Field(7 * 24 * 3600 * 1000, ge=-1)
    #: ``retention.bytes`` per partition of the events topic; -1 means unbounded.
    retention_bytes: int = Field(-1, ge=-1)
    #: ``segment.ms`` of the events topic; retention deletes whole closed segments only.
    segment_ms: int = Field(6 * 3600 * 1000, ge=1)
    #: ``min.insync.replicas`` for the events and index topics (clamped to the replication factor).
    min_insync_replicas: int = Field(2, ge=1)
    #: ``bridge serve`` creates missing topics (job topics included) at start; turn it off
    #: where topics are managed elsewhere (e.g. Strimzi KafkaTopic resources).
    auto_create: bool = True

    @property
    def events(self) -> str:
        return f"{self.prefix}.task-events"

    @property
    def index(self) -> str:
        return f"{self.prefix}.task-index"

    @property
    def control(self) -> str:
        return f"{self.prefix}.task-control"

    @property
    def updates(self) -> str:
        return f"{self.prefix}.task-updates"

    @property
    def subscriptions(self) -> str:
        """The compacted topic of the Events extension's webhook subscriptions (key: id)."""
        return f"{self.prefix}.event-subscriptions"

    def jobs(self, tool: str) -> str:
        return f"{self.prefix}.jobs.{tool}"


def env_name(*path: str) -> str:
    """The environment variable of a setting: ``env_name("kafka", "sasl", "password")``."""
    return "BRIDGE_" + "__".join(part.upper() for part in path)


def _blank_is_unset(value: Any) -> Any:
    # An empty variable (a manifest that sets every key, some to "") means "not set".
    return None if isinstance(value, str) and not value.strip() else value


def _existing_file(value: Path | None) -> Path | None:
    # Checked at load so a wrong mount path is one clear line at start, not a failed handshake.
    if value is None:
        return None
    path = value.expanduser()
    if not path.is_file():
        raise ValueError(f"file {path} does not exist (or is not a file)")
    return path


def _read_secret(inline: SecretStr | None, file: Path | None) -> str | None:
    # The file wins over the inline value and is read on every call, so a rotated Kubernetes
    # Secret reaches the next client built; its trailing newline (``echo`` into a file, or a
    # Secret made from one) is not part of the secret.
    if file is not None:
        return file.read_text(encoding="utf-8").rstrip("\r\n")
    return inline.get_secret_value() if inline is not None else None


class KafkaTlsSettings(BaseModel):
    """TLS to Kafka (``SSL`` and ``SASL_SSL``): the CA to trust, and a client certificate (mTLS).

    Without ``ca_file`` the system's CAs are trusted (managed services with public certificates).
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    #: PEM bundle of the CA(s) that signed the brokers' certificates.
    ca_file: Path | None = None
    #: PEM client certificate (chain) and its private key, for brokers that require mTLS.
    cert_file: Path | None = None
    key_file: Path | None = None
    key_password: SecretStr | None = None
    key_password_file: Path | None = None
    #: Verify that the broker's certificate names the host connected to; off for development only.
    check_hostname: bool = True

    _blank = field_validator(
        "ca_file", "cert_file", "key_file", "key_password", "key_password_file", mode="before"
    )(_blank_is_unset)
    _files = field_validator("ca_file", "cert_file", "key_file", "key_password_file")(
        _existing_file
    )

    @model_validator(mode="after")
    def _certificate_with_key(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError(
                f"a client certificate needs its key: set both {env_name('kafka', 'tls', 'cert_file')}"
                f" and {env_name('kafka', 'tls', 'key_file')}, or neither"
            )
        if self.key_file is None and (self.key_password or self.key_password_file):
            raise ValueError(
                f"{env_name('kafka', 'tls', 'key_password')} is set but there is no "
                f"{env_name('kafka', 'tls', 'key_file')}"
            )
        return self

    def key_password_value(self) -> str | None:
        """The private key's password, read now (``key_password_file`` wins)."""
        return _read_secret(self.key_password, self.key_password_file)

    @property
    def configured(self) -> bool:
        """True when any file is given (what only a TLS protocol can use)."""
        return any(path is not None for path in (self.ca_file, self.cert_file, self.key_file))


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


class KafkaSaslSettings(BaseModel):
    """SASL authentication to Kafka (``SASL_SSL`` and ``SASL_PLAINTEXT``).

    PLAIN and SCRAM take ``username`` and ``password`` (or ``password_file``); OAUTHBEARER takes a
    bearer token from ``oauth_token_file`` (re-read when it changes), or one fetched from an OIDC
    ``oauth_token_endpoint`` with the client-credentials grant and refreshed before it expires.
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    mechanism: SaslMechanism | None = None
    username: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = None
    oauth_token_file: Path | None = None
    oauth_token_endpoint: str | None = Field(None, pattern=r"^https?://\S+$")
    oauth_client_id: str | None = None
    oauth_client_secret: SecretStr | None = None
    oauth_client_secret_file: Path | None = None
    oauth_scope: str | None = None
    #: How the client authenticates to the token endpoint (RFC 6749 section 2.3.1): HTTP Basic
    #: (``client_secret_basic``, what every server must support) or in the form body.
    oauth_client_auth: Literal["client_secret_basic", "client_secret_post"] = "client_secret_basic"

    _blank = field_validator("*", mode="before")(_blank_is_unset)
    _files = field_validator("password_file", "oauth_token_file", "oauth_client_secret_file")(
        _existing_file
    )

    @model_validator(mode="after")
    def _credentials_for_the_mechanism(self) -> Self:
        if self.mechanism == "OAUTHBEARER":
            self._check_oauth()
        elif self.mechanism is not None:
            self._check_password()
        return self

    def _check_password(self) -> None:
        password = env_name("kafka", "sasl", "password")
        missing = [
            name
            for name, given in (
                (env_name("kafka", "sasl", "username"), self.username),
                (f"{password} (or {password}_FILE)", self.password or self.password_file),
            )
            if not given
        ]
        if missing:
            raise ValueError(
                f"{env_name('kafka', 'sasl', 'mechanism')}={self.mechanism} needs "
                + " and ".join(missing)
            )

    def _check_oauth(self) -> None:
        mechanism = f"{env_name('kafka', 'sasl', 'mechanism')}=OAUTHBEARER"
        sources = [self.oauth_token_file, self.oauth_token_endpoint]
        if all(source is None for source in sources):
            raise ValueError(
                f"{mechanism} needs a token: {env_name('kafka', 'sasl', 'oauth_token_file')} or "
                f"{env_name('kafka', 'sasl', 'oauth_token_endpoint')} (with a client id and secret)"
            )
        if all(source is not None for source in sources):
            raise ValueError(
                f"{mechanism}: set {env_name('kafka', 'sasl', 'oauth_token_file')} or "
                f"{env_name('kafka', 'sasl', 'oauth_token_endpoint')}, not both"
            )
        secret = self.oauth_client_secret or self.oauth_client_secret_file
        if self.oauth_token_endpoint is not None and not (self.oauth_client_id and secret):
            raise ValueError(
                f"{env_name('kafka', 'sasl', 'oauth_token_endpoint')} needs "
                f"{env_name('kafka', 'sasl', 'oauth_client_id')} and "
                f"{env_name('kafka', 'sasl', 'oauth_client_secret')} (or its _FILE)"
            )

    def password_value(self) -> str | None:
        """The PLAIN/SCRAM password, read now (``password_file`` wins)."""
        return _read_secret(self.password, self.password_file)

    def client_secret_value(self) -> str | None:
        """The OAuth client secret, read now (``oauth_client_secret_file`` wins)."""
        return _read_secret(self.oauth_client_secret, self.oauth_client_secret_file)

    @property
    def configured(self) -> bool:
        """True when a mechanism is chosen (what only a SASL protocol can use)."""
        return self.mechanism is not None


class KafkaLocalSettings(BaseModel):
    """The embedded single-node broker used when no cluster is given and no Docker answers."""

    version: str = Field("4.1.1", pattern=r"^\d+\.\d+\.\d+$")
    cache_dir: Path = _DEFAULT_CACHE
    state_dir: Path = _DEFAULT_CACHE / "local-broker"
    heap: str = "1g"
    start_timeout_s: float = Field(120.0, gt=0)
    #: Try a Docker engine (testcontainers) before the local jars.
    use_docker: bool = True


class ToolSpec(BaseModel):
    """A tool the bridge offers; a job pipeline (worker) consuming ``job_topic`` runs it."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$")
    title: str | None = None
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    output_schema: dict[str, Any] | None = None
    #: "required": only as a task (-32021 for clients without the extension); "optional": a
    #: task for clients that declare the extension, a direct result for the others;
    #: "forbidden": always a direct result (the job still runs on a worker).
    task: Literal["forbidden", "optional", "required"] = "optional"
    #: Client capabilities the tool needs, e.g. ``{"sampling": {}}`` (-32021 without them).
    requires: dict[str, Any] | None = None
    #: Input requests answered through multi round-trip (InputRequiredResult) *before* the
    #: task is created; the answers reach the job as ``input_responses``.
    input_before: dict[str, Any] | None = None
    #: The job topic; default ``<prefix>.jobs.<name>``.
    job_topic: str | None = None
    ttl_ms: int | None = Field(3_600_000, ge=1)
    poll_interval_ms: int = Field(500, ge=10)


#: An argument name of a configured event source (a JSON object member, kept simple).
_ARGUMENT = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"


class EventSourceSpec(BaseModel):
    """An event type over an existing pipeline's Kafka topic (docs/events.md, "Configured
    sources"): each record of ``topic`` that passes the filters is one occurrence, its JSON
    value the occurrence's ``data``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    topic: str = Field(pattern=r"^[A-Za-z0-9._-]{1,249}$")
    description: str = ""
    #: Only records with exactly this key (UTF-8); or, with ``key_argument``, the key the
    #: subscriber names in that (required) argument. At most one of the two.
    key: str | None = None
    key_argument: str | None = Field(None, pattern=_ARGUMENT)
    #: Only records carrying each of these headers with exactly this (UTF-8) value.
    headers: dict[str, str] = Field(default_factory=dict)
    #: Optional arguments that filter on a header: ``{argument: header name}``.
    header_arguments: dict[str, str] = Field(default_factory=dict)
    #: JSON Schema of the record values; records that are not a JSON object or fail it are
    #: skipped and counted.
    payload_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    #: Who may poll or stream it: principal names, or ``"*"`` for every caller. Nobody by
    #: default: the topic is another pipeline's data, so reading it is granted explicitly.
    principals: list[str] = Field(default_factory=list)
    #: events/poll's ``nextPollMs``.
    poll_interval_ms: int = Field(5000, ge=1000)

    @field_validator("header_arguments")
    @classmethod
    def _argument_names(cls, value: dict[str, str]) -> dict[str, str]:
        for argument in value:
            if re.fullmatch(_ARGUMENT, argument) is None:
                raise ValueError(f"header_arguments: {argument!r} is not an argument name")
        return value

    @field_validator("payload_schema")
    @classmethod
    def _a_json_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            jsonschema.Draft202012Validator.check_schema(value)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"payload_schema is not a JSON Schema: {exc.message}") from None
        return value

    @model_validator(mode="after")
    def _one_key_rule(self) -> Self:
        if self.key is not None and self.key_argument is not None:
            raise ValueError(f"event source {self.name}: set key or key_argument, not both")
        if self.key_argument is not None and self.key_argument in self.header_arguments:
            raise ValueError(f"event source {self.name}: argument {self.key_argument!r} twice")
        return self


JwtAlgorithm = Literal["HS256", "RS256"]
_RS256: JwtAlgorithm = "RS256"


#: The least length of an HS256 key: RFC 7518 section 3.2 wants a key at least as long as the
#: hash output (256 bits).
JWT_HS256_MIN_BYTES = 32


class AuthSettings(BaseModel):
    """Who is calling. Every task is bound to the principal that created it."""

    #: "none": everyone is the principal "anonymous" (task ids are then the only secret);
    #: "bearer": static tokens; "jwt": signed JSON Web Tokens (HS256 or RS256).
    mode: Literal["none", "bearer", "jwt"] = "none"
    #: Mode "none" on an address other than loopback serves every caller who reaches the port
    #: as one principal; ``bridge serve`` refuses that unless this says it is meant (behind an
    #: authenticating gateway), and then warns at every start.
    allow_unauthenticated: bool = False
    #: Static tokens, ``{token: principal}``; prefer ``tokens_file`` (JSON of the same shape).
    tokens: dict[str, str] = Field(default_factory=dict, repr=False)
    tokens_file: Path | None = None
    #: How long a static bearer token's authentication lasts on an open stream: a stream opened
    #: with one ends (without a result) after this many seconds, and the client authenticates
    #: again and resumes with its cursor. None: static tokens do not expire. (A JWT's ``exp``
    #: and a view token's expiry always end the streams opened with them.)
    bearer_ttl_s: int | None = Field(None, ge=1)
    jwt_algorithms: list[JwtAlgorithm] = Field(default_factory=lambda: [_RS256])
    jwt_secret: SecretStr | None = None
    #: A JWKS document (``{"keys": [...]}``) with the RS256 public keys.
    jwks_file: Path | None = None
    #: The ``aud`` and ``iss`` every token must carry; both required in mode "jwt", so that a
    #: token the same issuer minted for another API is refused.
    jwt_audience: str | None = None
    jwt_issuer: str | None = None
    #: The claim that names the principal.
    jwt_principal_claim: str = "sub"

    _blank = field_validator("jwt_audience", "jwt_issuer", mode="before")(_blank_is_unset)

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens_never_named(cls, value: object) -> object:
        """Refuse a bad entry without naming it: a static token is the dict's key, and
        pydantic's own error would give it as the entry's location."""
        if isinstance(value, dict):
            for token, principal in value.items():
                if not isinstance(token, str) or not isinstance(principal, str):
                    raise ValueError("every static token must map to a principal name (text)")
        return value

    @model_validator(mode="after")
    def _jwt_is_bound_to_this_api(self) -> Self:
        if self.mode != "jwt":
            return self
        missing = [
            env_name("auth", name)
            for name, value in (
                ("jwt_audience", self.jwt_audience),
                ("jwt_issuer", self.jwt_issuer),
            )
            if value is None
        ]
        if missing:
            raise ValueError(
                f"{env_name('auth', 'mode')}=jwt needs {' and '.join(missing)}: every token's aud "
                "and iss are checked, so a token minted for another API is refused"
            )
        return self

    @model_validator(mode="after")
    def _hs256_key_long_enough(self) -> Self:
        secret = self.jwt_secret.get_secret_value().encode() if self.jwt_secret else None
        hs256 = self.mode == "jwt" and "HS256" in self.jwt_algorithms
        if hs256 and secret is not None and len(secret) < JWT_HS256_MIN_BYTES:
            raise ValueError(
                f"{env_name('auth', 'jwt_secret')} must have at least {JWT_HS256_MIN_BYTES} bytes "
                "for HS256 (RFC 7518 section 3.2: no shorter than the hash output)"
            )
        return self


class IdentitySettings(BaseModel):
    """The keys that sign task identities (``BRIDGE_IDENTITY__*``; docs/operations.md, "Task
    identity keys"). Only records signed by one of them (or honoured by the upgrade rule) define
    a task: a pipeline with WRITE on the events topic appends events but never creates one.
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    #: The keyring file: one ``<key id> <base64 key of 32+ bytes>`` per line, the signing key
    #: first, older keys after it (they still verify). Read at start; wins over ``keys``.
    keys_file: Path | None = None
    #: The same text inline (a secret: never logged, no repr).
    keys: SecretStr | None = None
    #: Neither set: replicas (``replicas.ownership = "group"``) derive a key from the peer secret; one
    #: process (``"all"``) makes a development key here once (0600) and warns. A read-only or
    #: missing home refuses to start with the setting to fix.
    dev_keys_file: Path = Path.home() / ".local" / "state" / "mcp-kafka-bridge" / "identity.keys"

    @field_validator("keys_file")
    @classmethod
    def _keys_file_exists(cls, value: Path | None) -> Path | None:
        return _existing_file(value)

    def keyring_text(self) -> str | None:
        """The configured keyring's text (the file wins), or None."""
        return _read_secret(self.keys, self.keys_file)

    @model_validator(mode="after")
    def _keyring_usable(self) -> Self:
        # Refused at load, in one line naming the setting (never the key), not at first use.
        text = self.keyring_text()
        if text is not None:
            from bridge.keyring import KeyringError, parse_keyring

            try:
                parse_keyring(text)
            except KeyringError as exc:
                raise ValueError(f"{env_name('identity', 'keys_file')}: {exc}") from None
        return self


class TracingSettings(BaseModel):
    """OpenTelemetry tracing (docs/operations.md "Tracing"): off by default.

    Set as ``BRIDGE_TRACING__ENABLED=true`` and so on; spans go to an OTLP/HTTP collector.
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    #: Make spans and export them (needs the ``tracing`` extra: the OpenTelemetry SDK).
    enabled: bool = False
    #: The collector's OTLP/HTTP traces URL.
    otlp_endpoint: str = "http://localhost:4318/v1/traces"
    #: Headers sent with every export, ``key=value`` pairs separated by commas (often a vendor's
    #: API key: a secret, never logged or shown in a repr).
    otlp_headers: SecretStr | None = None
    #: Share of new traces recorded; a caller's sampled flag is followed either way.
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)
    #: The ``service.name`` resource attribute of every span.
    service_name: str = Field("mcp-kafka-bridge", min_length=1)

    @field_validator("otlp_headers")
    @classmethod
    def _pairs(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            _header_pairs(value.get_secret_value())  # refuse a malformed list at start-up
        return value

    def otlp_header_map(self) -> dict[str, str]:
        """The export headers as a dict (empty when unset)."""
        return _header_pairs(self.otlp_headers.get_secret_value()) if self.otlp_headers else {}


def _header_pairs(text: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # Never echo the item: it may be the secret itself.
            raise ValueError("tracing otlp_headers must be key=value pairs separated by commas")
        pairs[key.strip()] = value.strip()
    return pairs


class WebhookKeySettings(BaseModel):
    """Where the key that seals webhook signing secrets at rest comes from (docs/events.md,
    "Secrets at rest"). Set as ``BRIDGE_WEBHOOKS__KEYS__FILE`` and so on.

    Without a key file webhook delivery is off (``events/subscribe`` is refused and nothing is
    stored): secrets are never written to Kafka in clear.
    """

    model_config = ConfigDict(extra="forbid")

    #: The key file: ``{"current": id, "keys": {id: base64 of 32 bytes}}``, the same on every
    #: replica (mount it from a secret store); ``bridge webhooks new-key FILE`` writes one.
    file: Path | None = None
    #: Create ``file`` with a fresh key when it does not exist: for development only (a key made
    #: on one replica's disk is unknown to the others and lost with the disk).
    create: bool = False


class PeerSettings(BaseModel):
    """The peer listener: where replicas send each other the requests they forward
    (``replicas.ownership = "group"``; docs/deployment.md, "The peer listener").

    Set as ``BRIDGE_PEERS__PORT=8081`` and so on. Only signed hops are served there, and the
    public listener never honours a hop. ``advertised_url`` is this listener's URL.
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    #: The address the peer listener binds (unset: ``server.host``) and its port; the port of
    #: every owner URL a replica accepts from the group.
    host: str | None = None
    port: int = Field(8081, ge=1, le=65535)
    #: The base URL other replicas reach this one's peer listener at
    #: (``http://<pod>.<headless service>:8081``: the scheme and ``port`` of this listener).
    advertised_url: str | None = Field(None, pattern=r"^https?://[^/\s]+$")
    #: The shared secret that authenticates a forwarded request between replicas (at least 32
    #: characters; prefer the file). Never logged; clients can never present it.
    secret: SecretStr | None = None
    secret_file: Path | None = None
    #: Hosts an owner URL read from the group may name: an exact name or address, or a suffix
    #: that starts with a dot (``.bridge-peers.ns.svc.cluster.local``). Empty: the host of
    #: ``advertised_url`` itself, and when it is a DNS name of several labels, every name that
    #: shares its parent domain (the headless Service's).
    hosts: list[str] = Field(default_factory=list)
    #: TLS of the peer listener (scheme ``https``): its certificate and key, and the CA that
    #: signed the replicas' certificates (a replica verifies the owner with it).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_ca_file: Path | None = None
    #: Mutual TLS: the listener asks for a client certificate signed by ``tls_ca_file``, and a
    #: replica presents its own (``tls_cert_file``, which must allow client authentication).
    tls_client_auth: bool = False
    #: How far a hop's timestamp may be from this replica's clock (skew and transit): a hop is
    #: checked once when it arrives, so this bounds only how long a captured hop is worth
    #: replaying, and how long its nonce is remembered.
    max_age_s: float = Field(10.0, ge=1.0, le=60.0)
    #: Nonces of accepted hops remembered (over ``max_age_s``) to refuse a replay. When it is
    #: full, further hops are refused (retriable) until entries expire, never forgotten early:
    #: size it above the peak hop rate times twice ``max_age_s``.
    max_nonces: int = Field(100_000, ge=1_000, le=10_000_000)
    #: How long a replica waits to connect to an owner's peer listener (replicas share a pod
    #: network: a connect that takes longer is to an owner that is gone).
    connect_timeout_s: float = Field(2.0, gt=0, le=60.0)
    #: After an owner could not be connected to, requests about its partitions are answered
    #: with the retriable ``owner_unavailable`` at once, without trying it again (never a
    #: per-request wait on a dead peer while the group notices it is gone), until the ownership
    #: map changes or a background probe reaches it: the probe's delay doubles up to this
    #: (jittered). 0 turns suspicion off.
    suspect_s: float = Field(2.0, ge=0, le=60.0)

    _files = field_validator("tls_cert_file", "tls_key_file", "tls_ca_file", "secret_file")(
        _existing_file
    )

    @property
    def secret_value(self) -> str | None:
        """The peer secret (from the file if one is set), or None."""
        return _read_secret(self.secret, self.secret_file)

    @field_validator("hosts")
    @classmethod
    def _host_names(cls, value: list[str]) -> list[str]:
        allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-.:[]")
        for host in value:
            if not host or not set(host.lower()) <= allowed or host in (".", ".."):
                raise ValueError(f"peers.hosts: {host!r} is not a host name, address or .suffix")
        return [host.lower() for host in value]

    @model_validator(mode="after")
    def _tls_complete(self) -> Self:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError(
                f"{env_name('peers', 'tls_cert_file')} and {env_name('peers', 'tls_key_file')} "
                "go together"
            )
        if self.tls_client_auth and (self.tls_cert_file is None or self.tls_ca_file is None):
            raise ValueError(
                f"{env_name('peers', 'tls_client_auth')} needs the listener's certificate, key "
                f"and {env_name('peers', 'tls_ca_file')}"
            )
        return self

    @property
    def scheme(self) -> Literal["http", "https"]:
        """``https`` when the listener serves TLS."""
        return "https" if self.tls_cert_file is not None else "http"

    def origin(self, url: str, hosts: list[str]) -> str:
        """``url`` as ``scheme://host:port`` (lower case) when it names a peer listener of
        this configuration: the scheme, the port, a host in ``hosts`` (see :attr:`hosts`), and
        nothing else (no user, path, query or fragment). ``ValueError`` otherwise.

        One pass of :func:`urllib.parse.urlsplit` over at most 300 characters: the URL comes
        from the group's metadata, which any member of the group writes.
        """
        if len(url) > 300:
            raise ValueError("longer than 300 characters")
        try:
            parts = urlsplit(url)
            port = parts.port if parts.port is not None else _DEFAULT_PORTS.get(parts.scheme)
        except ValueError:
            raise ValueError("not a URL") from None
        host = (parts.hostname or "").lower()
        if parts.scheme != self.scheme:
            raise ValueError(f"scheme is not {self.scheme}")
        if (
            parts.username is not None
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
        ):
            raise ValueError("more than scheme, host and port")
        if port != self.port:
            raise ValueError(f"port is not the peer port {self.port}")
        if not _host_name_or_address(host):
            raise ValueError(f"host {host!r} is neither an IP address nor a DNS name")
        if not any(_host_matches(host, entry) for entry in hosts):
            raise ValueError(f"host {host!r} is not an accepted peer host")
        shown = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{shown}:{port}"

    def accepted_hosts(self, advertised_url: str) -> list[str]:
        """:attr:`hosts`, or the default derived from ``advertised_url``."""
        if self.hosts:
            return self.hosts
        host = (urlsplit(advertised_url).hostname or "").lower()
        labels = host.split(".")
        if ":" in host or len(labels) < 2 or all(label.isdigit() for label in labels):
            return [host]  # an address, or a single label: itself only
        return [host, "." + host.split(".", 1)[1]]


_DEFAULT_PORTS = {"http": 80, "https": 443}


_LDH = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


def _host_name_or_address(host: str) -> bool:
    """An IP literal (no zone) or lower-case LDH labels, each 1-63 characters, not starting or
    ending with '-': nothing a resolver could read otherwise (``\\.``, ``%00``). Linear."""
    if "%" not in host:
        try:
            ipaddress.ip_address(host)
            return True
        except ValueError:
            pass
    return len(host) <= 253 and all(
        0 < len(label) <= 63 and set(label) <= _LDH and label[0] != "-" and label[-1] != "-"
        for label in host.split(".")
    )


def _host_matches(host: str, entry: str) -> bool:
    # Plain comparisons, no pattern: ".b.c" accepts "a.b.c" (any depth), never "b.c" or "xb.c".
    if entry.startswith("."):
        return len(host) > len(entry) and host.endswith(entry)
    return host == entry


class EventCursorSettings(BaseModel):
    """The cursors the Events extension mints (docs/events.md). Set as
    ``BRIDGE_EVENTS__CURSORS__TASK_VERSION``."""

    model_config = ConfigDict(extra="forbid")

    #: ``task.event`` cursors: 2 names the task (a cursor of another task is refused); 1 is the
    #: form versions up to 8fd441c read, for the span of a rolling upgrade from them (both are
    #: read either way). Unset: 1 while ``upgrade.from`` is set, else 2 (see
    #: :func:`task_cursor_version`).
    task_version: Literal[1, 2] | None = None

    @field_validator("task_version", mode="before")
    @classmethod
    def _from_text(cls, value: object) -> object:
        # An environment variable is text, and a Literal of ints takes no "1" in pydantic.
        return int(value) if isinstance(value, str) and value.strip() in ("1", "2") else value


class EventsSettings(BaseModel):
    """The Events extension (docs/events.md): which client the ``events/*`` methods speak to,
    for the whole deployment ("Client profiles", ``BRIDGE_EVENTS__PROFILE``), its cursors and
    its configured sources.

    ``sep-3415`` (the default) follows the SEP; ``chatgpt`` adds what ChatGPT's MCP Events
    integration expects (:mod:`bridge.server.profile`). Poll and push stay available either way.
    """

    model_config = ConfigDict(extra="forbid")

    profile: Literal["sep-3415", "chatgpt"] = "sep-3415"
    #: The cursors the extension mints (:class:`EventCursorSettings`).
    cursors: EventCursorSettings = EventCursorSettings()
    #: Event types over existing pipelines' topics (:class:`EventSourceSpec`).
    sources: list[EventSourceSpec] = Field(default_factory=list)


class HandoverSettings(BaseModel):
    """How partitions move between replicas without their users noticing
    (``BRIDGE_HANDOVER__*``; docs/deployment.md, "A replica is stopped").

    ``timeout_s`` bounds a hand-over: how long a stopping replica (SIGTERM,
    ``replicas.ownership = "group"``) waits for the others to take and serve its partitions
    before it ends what is left, and how long any replica keeps a lost partition's streams open
    waiting for its new owner to serve it. The pod's ``terminationGracePeriodSeconds`` must
    exceed preStop + this + the streams' drain (10 s). 0: no hand-over (partitions are told lost
    at once, a stopping replica keeps its partitions until the session timeout).
    """

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(20.0, ge=0, le=600)
    #: Replicas that keep a warm copy of each partition's index (bridge/log/standby.py): each
    #: costs about as much memory as the partitions' owners hold, and one more read of the
    #: index topic. 0: none (a gained partition is restored from its whole index slice).
    standbys: int = Field(1, ge=0, le=3)


class UpgradeSettings(BaseModel):
    """A rolling upgrade in progress (CHANGELOG.md "Upgrade", docs/operations.md). Set as
    ``BRIDGE_UPGRADE__FROM``.

    ``from_="0.1"``: replicas of 0.1.0 may still run. This version then writes what they read
    (index records and markers of version 2, clear subscription records, ``task.event``
    cursors of version 1), honours unsigned ``task.created`` records as they do, and fixes no
    upgrade offset. Step 1 rolls every replica with it set; step 2 rolls again without it.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    from_: Literal["0.1"] | None = Field(None, alias="from")
    #: Read webhook subscription records stored in clear (by 0.1.0, or in step 1) without
    #: ``from``: step 2 of an upgrade from 0.1, while its replicas reseal them. Off otherwise,
    #: so that nobody who may write the subscriptions topic can add a subscription in clear.
    clear_subscriptions: bool = False

    @field_validator("from_", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # An env var set to "" (a template's empty value) means no upgrade under way.
        return None if value == "" else value

    @property
    def legacy(self) -> bool:
        """Write and honour what 0.1.0 writes and honours (step 1 of the upgrade)."""
        return self.from_ is not None

    @property
    def reads_clear_subscriptions(self) -> bool:
        """Webhook subscription records in clear are read (steps 1 and 2 of the upgrade)."""
        return self.legacy or self.clear_subscriptions


class RecoverySettings(BaseModel):
    """How replicas recover from an owner that died, and pace clients that come back (set as
    ``BRIDGE_RECOVERY__REMOVE_DEAD_OWNERS=false`` and so on; docs/deployment.md, "Ownership
    and failover", and docs/tasks-stream.md §9, "Retention and limits").
    """

    model_config = ConfigDict(extra="forbid")

    #: Have the group drop an owner whose peer port keeps refusing connections (its process is
    #: gone) now, instead of after the group's session timeout: a LeaveGroup by its static
    #: instance id, taken from the group's own ownership map (``replicas.ownership = "group"`` with
    #: ``replicas.instance_id`` set on every replica; an owner without one is never removed).
    remove_dead_owners: bool = True
    #: Refused connections in a row, within ``refusal_window_s``, that make an owner dead (the
    #: first request's and its probes'; a timeout never counts: a busy owner causes those).
    refusals: int = Field(3, ge=2, le=20)
    refusal_window_s: float = Field(5.0, gt=0, le=60.0)
    #: At most one removal per this many seconds from this replica (a bound on what a wrong
    #: verdict can cost: one rebalance).
    remove_interval_s: float = Field(30.0, ge=1.0, le=3600.0)
    #: Events per second a stream's catch-up (what it reads from the log: a reconnect's replay,
    #: a slow stream's catch-up reads) is paced to, per stream; 0: not paced. Live events are
    #: never held back.
    replay_events_per_s: float = Field(0.0, ge=0, le=1_000_000)
    #: The catch-up's burst: events a paced stream may send at once before the pace applies.
    replay_burst: int = Field(1000, ge=1, le=1_000_000)


def task_cursor_version(settings: Settings) -> int:
    """The ``task.event`` cursor version to mint: the explicit setting, else 1 during an
    upgrade from 0.1 (its replicas refuse version 2), else 2."""
    explicit = settings.events.cursors.task_version
    if explicit is not None:
        return explicit
    return 1 if settings.upgrade.legacy else 2


_GROUP = ConfigDict(extra="forbid", hide_input_in_errors=True)


class KafkaSettings(BaseModel):
    """The cluster and how every Kafka client of the project reaches it (``BRIDGE_KAFKA__*``)."""

    model_config = _GROUP

    #: An existing cluster; when unset the local broker provider is used.
    bootstrap_servers: str | None = None
    security_protocol: SecurityProtocol = "PLAINTEXT"
    #: TLS (CA, client certificate) for ``SSL`` / ``SASL_SSL``; SASL credentials for ``SASL_*``.
    tls: KafkaTlsSettings = KafkaTlsSettings()
    sasl: KafkaSaslSettings = KafkaSaslSettings()
    client_id: str = "mcp-kafka-bridge"
    #: How long every Kafka client waits for a broker's answer before it gives up on the request
    #: (and the connection); unset keeps aiokafka's defaults (40 s, the admin client 30 s).
    request_timeout_ms: int | None = Field(None, ge=1_000, le=600_000)
    #: The embedded broker used when no cluster is given (development).
    local: KafkaLocalSettings = KafkaLocalSettings()

    @field_validator("bootstrap_servers")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None

    @model_validator(mode="after")
    def _security_fits_the_protocol(self) -> Self:
        protocol = self.security_protocol
        setting = f"{env_name('kafka', 'security_protocol')}={protocol}"
        uses_sasl = protocol.startswith("SASL_")
        if uses_sasl and not self.sasl.configured:
            raise ValueError(
                f"{setting} needs {env_name('kafka', 'sasl', 'mechanism')} (PLAIN, SCRAM-SHA-256, "
                "SCRAM-SHA-512 or OAUTHBEARER) and its credentials"
            )
        # Credentials a protocol would ignore are a mistake worth a line: they were meant to
        # protect something that would otherwise travel without them.
        if not uses_sasl and self.sasl.configured:
            raise ValueError(
                f"{env_name('kafka', 'sasl', 'mechanism')} is set but {setting} does not use "
                "SASL: use SASL_SSL (or SASL_PLAINTEXT)"
            )
        if protocol not in ("SSL", "SASL_SSL") and self.tls.configured:
            raise ValueError(
                f"TLS files are set ({env_name('kafka', 'tls')}__*) but {setting} does not use "
                "TLS: use SSL or SASL_SSL"
            )
        return self


@lru_cache(maxsize=16)
def _event_type_rule(accepted: tuple[str, ...]) -> EventTypeRule:
    # Not a cached_property: model_copy(update=...) would carry a stale rule along.
    return EventTypeRule(accepted)


class TasksSettings(BaseModel):
    """The tasks and their events (``BRIDGE_TASKS__*``)."""

    model_config = _GROUP

    #: Vendor prefix of every event type the bridge itself emits: reverse-DNS under a real
    #: top-level domain, or one of ``accepted_event_prefixes``.
    event_type_prefix: str = Field("io.mcpbridge", pattern=r"^[a-z0-9-]+(\.[a-z0-9-]+)*$")
    #: Vendor prefixes that are not reverse-DNS under a real top-level domain (for example
    #: ``acme.internal``) but that the operator vouches for: ``<prefix>.<name>`` types count
    #: as vendor-prefixed. Reverse-DNS types (``com.example.x``) need no entry here.
    accepted_event_prefixes: list[str] = Field(default_factory=list)
    #: Largest encoded event record accepted by the publisher and served by the reader.
    max_event_bytes: int = Field(256 * 1024, ge=1024, le=16 * 1024 * 1024)
    #: One sparse (seq, offset) checkpoint is kept every this many events of a task.
    checkpoint_interval: int = Field(64, ge=1, le=1_000_000)
    #: Non-terminal tasks one principal may have at once.
    max_active_per_principal: int = Field(100, ge=1)
    #: How long a client without the tasks extension waits for an optional-task tool's result.
    direct_result_timeout_s: float = Field(300.0, gt=0)
    #: How far back a worker reads the control topic at start (cancel requests, input answers).
    control_lookback_ms: int = Field(3_600_000, ge=0)

    @field_validator("accepted_event_prefixes")
    @classmethod
    def _dns_prefixes(cls, value: list[str]) -> list[str]:
        EventTypeRule(value)  # raises ValueError naming a prefix that is not DNS labels
        return value

    @model_validator(mode="after")
    def _vendor_prefix(self) -> Self:
        if not _event_type_rule(tuple(self.accepted_event_prefixes)).is_namespace(
            self.event_type_prefix
        ):
            raise ValueError(
                f"tasks.event_type_prefix {self.event_type_prefix!r} is not a vendor prefix: use "
                "reverse-DNS under a real top-level domain (e.g. 'com.example') or list it in "
                "tasks.accepted_event_prefixes"
            )
        return self


class ServerSettings(BaseModel):
    """The HTTP listener of ``bridge serve`` and what it accepts (``BRIDGE_SERVER__*``)."""

    model_config = _GROUP

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    #: The event loop ``bridge serve`` runs in (uvicorn's ``loop``): asyncio. uvloop is opt-in
    #: (not a dependency): it halves uvicorn's own CPU per connection with httptools, yet a
    #: bridge on it served only about half of bench_streams' 10,000-resume storm within 25 s,
    #: against all of them in 14-16 s on asyncio (docs/benchmarks-streams.md). ``auto`` is
    #: uvloop when it is installed, else asyncio. ``bridge demo`` runs in the loop it was
    #: started in, whatever this says.
    loop: Literal["auto", "asyncio", "uvloop"] = "asyncio"
    #: The HTTP/1.1 parser of the server (uvicorn's ``http``): httptools, a dependency of the
    #: package, costs half of h11's CPU per connection (0.22-0.26 against 0.45-0.48 ms in
    #: bench/bench_http_floor.py), which every stream open pays. h11 (pure Python) stays a
    #: choice; ``auto`` is httptools when it is installed, else h11.
    http: Literal["auto", "h11", "httptools"] = "httptools"
    #: Slow and idle clients (bridge/server/protocols.py): a request's head and body must
    #: arrive within ``read_timeout_s`` of the connection opening or of the request's first
    #: byte (else 408 and the connection closes; an open stream is never cut by it), its head
    #: may hold ``max_head_bytes`` (else 431), and an idle connection is closed
    #: ``keep_alive_s`` after its last response.
    read_timeout_s: float = Field(30.0, gt=0, le=3600)
    max_head_bytes: int = Field(64 * 1024, ge=4096, le=1024 * 1024)
    keep_alive_s: int = Field(5, ge=1, le=3600)
    #: ``bridge serve``, once serving, freezes what it made at start out of the garbage
    #: collector's scans and runs a young collection every this many allocations (Python's
    #: default: 700): far fewer full collections, each a pause every stream shares, when
    #: thousands of streams open at once (bridge/server/runner.py tune_gc). 100,000 rather than
    #: 10,000: in the 10,000-resume storm, collections took 2.5 s of the bridge's 6.8 s of CPU
    #: at 10,000 (gc.callbacks) and 1.3 s at 100,000; idle stream RSS unchanged (17.4 KiB).
    #: Cyclic garbage waits for at most that many net allocations. 0: Python's defaults.
    gc_young_threshold: int = Field(100_000, ge=0)
    #: Hosts (``Host`` header, port ignored) and origins accepted by the MCP endpoint, against
    #: DNS rebinding; loopback names are always accepted.
    allowed_hosts: list[str] = Field(default_factory=list)
    allowed_origins: list[str] = Field(default_factory=list)
    #: Largest JSON-RPC request body accepted.
    max_request_bytes: int = Field(1024 * 1024, ge=1024)
    #: Seconds between refreshes of the Kafka gauges (offsets, lag, retention headroom).
    metrics_refresh_s: float = Field(5.0, gt=0)
    #: POST /admin/indexer/pause|resume, for operations drills and tests; never expose publicly.
    admin_endpoints: bool = False

    @field_validator("loop", "http")
    @classmethod
    def _installed(cls, value: str) -> str:
        # Named explicitly, the package must be there: a clear error now, not uvicorn's later.
        if value in ("uvloop", "httptools") and importlib.util.find_spec(value) is None:
            raise ValueError(f"{value} is not installed (pip install {value}, or say auto)")
        return value


class StreamSettings(BaseModel):
    """Long-lived responses: tasks/stream, listens, events/stream, the view's EventSource
    (``BRIDGE_STREAMS__*``). The limits are per client (the principal when the caller
    authenticated, else the anonymous caller's address) or per process, against denial of
    service."""

    model_config = _GROUP

    #: Concurrent streams of one client, and its opens and resumes a minute.
    max_per_principal: int = Field(32, ge=1)
    opens_per_minute: int = Field(600, ge=1)
    #: Concurrent streams of this whole process.
    max_total: int = Field(10_000, ge=1)
    #: Events buffered per stream before it falls back to catch-up reads, and the idle time
    #: after which a keep-alive comment is sent.
    queue_size: int = Field(1024, ge=1)
    keepalive_s: float = Field(15.0, gt=0)
    #: How long a replica catches its view up to the partition's end before it refuses a
    #: tasks/stream cursor ahead of the task's head (on timeout the stream is admitted).
    cursor_catch_up_s: float = Field(5.0, gt=0)


class ReplicaSettings(BaseModel):
    """How replicas divide the events partitions (``BRIDGE_REPLICAS__*``; the listener they
    forward to is :class:`PeerSettings`)."""

    model_config = _GROUP

    #: Which events partitions this process indexes, persists and serves: ``all`` (one process
    #: owns everything; nothing else to configure) or ``group`` (replicas divide the partitions
    #: through the Kafka consumer group ``<prefix>.bridge`` and forward a request about another
    #: replica's partition to its owner). ``group`` needs ``peers.advertised_url`` and a peer
    #: secret.
    ownership: Literal["all", "group"] = "all"
    #: Static group membership (the pod's stable name): a restart within the session timeout
    #: gets the same partitions back without a rebalance.
    instance_id: str | None = Field(None, pattern=r"^[A-Za-z0-9._-]{1,200}$")
    #: The group's session timeout: how long a replica that died unannounced keeps its partitions.
    session_timeout_ms: int = Field(10_000, ge=1_000, le=300_000)
    #: How long a request about a partition that is moving waits for an owner before it is
    #: answered with a retriable error.
    owner_wait_s: float = Field(5.0, ge=0)


class WebhookSettings(BaseModel):
    """The Events extension's webhook subscriptions (docs/events.md, "Webhooks";
    ``BRIDGE_WEBHOOKS__*``)."""

    model_config = _GROUP

    #: Callback hosts (names) or CIDRs that may resolve to non-global addresses (loopback,
    #: private networks). Empty: only globally routable addresses are ever contacted.
    allowlist: list[str] = Field(default_factory=list)
    #: A PEM bundle trusted for callback TLS in addition to the system CAs (private receivers).
    ca_file: Path | None = None
    #: TTL granted when the client suggests none; the least and the most ever granted (a
    #: ``ttlMs: null`` request for no expiry gets the most: no subscription lives forever).
    ttl_default_ms: int = Field(3_600_000, ge=1000)
    ttl_min_ms: int = Field(60_000, ge=1000)
    ttl_max_ms: int = Field(86_400_000, ge=1000)
    #: Live webhook subscriptions one principal may hold (ResourceExhausted beyond).
    max_subscriptions_per_principal: int = Field(100, ge=1)
    #: Retries of one delivery: attempts, total time, full-jitter backoff base and ceiling.
    max_attempts: int = Field(5, ge=1, le=20)
    max_retry_s: float = Field(900.0, gt=0)
    backoff_base_s: float = Field(5.0, gt=0)
    backoff_max_s: float = Field(300.0, gt=0)
    #: How long one POST may take before it counts as a ``timeout``.
    timeout_s: float = Field(5.0, gt=0)
    #: How often a quiet subscription looks for new events (the delivery loop polls).
    poll_interval_s: float = Field(1.0, gt=0)
    #: Deliveries given up in a row before a subscription is suspended until its next refresh.
    suspend_after_failures: int = Field(10, ge=1)
    #: How long the replaced secret still signs (beside the new one) after a rotation.
    rotation_grace_s: float = Field(600.0, ge=0)
    #: Verification challenges one principal may send to one callback host: this many at once,
    #: then ``verify_per_minute`` (ResourceExhausted beyond; a refresh sends none).
    verify_burst: int = Field(10, ge=1)
    verify_per_minute: float = Field(12.0, gt=0)
    #: Verification challenges one principal may send to all hosts together, checked first:
    #: this many at once, then ``verify_principal_per_minute``. Bounds too the (principal, host)
    #: buckets one principal holds, so it cannot crowd others out of them.
    verify_principal_burst: int = Field(30, ge=1)
    verify_principal_per_minute: float = Field(60.0, gt=0)
    #: The key that seals the signing secrets in the subscriptions topic (WebhookKeySettings).
    keys: WebhookKeySettings = WebhookKeySettings()

    _ca = field_validator("ca_file")(_existing_file)

    @model_validator(mode="after")
    def _ttls_in_order(self) -> Self:
        if not self.ttl_min_ms <= self.ttl_default_ms <= self.ttl_max_ms:
            raise ValueError(
                "webhook TTLs must be ordered: webhooks.ttl_min_ms <= webhooks.ttl_default_ms "
                "<= webhooks.ttl_max_ms"
            )
        return self


class ViewSettings(BaseModel):
    """The browser view of a task and its plain SSE endpoint (docs/browser.md;
    ``BRIDGE_VIEW__*``)."""

    model_config = _GROUP

    #: Serve ``/view/`` (the page), ``POST /view/token`` and ``/view/tasks/{id}[/events]``.
    enabled: bool = True
    #: Lifetime of a view token: it opens (and resumes) one task's view for one principal,
    #: read-only, and travels in a URL, so it is short-lived.
    token_ttl_s: int = Field(900, ge=10, le=86_400)
    #: The key that signs view tokens (at least 32 characters; prefer the file). Unset: derived
    #: from the peer secret when replicas divide the partitions (any replica accepts a token
    #: another minted), else a random key per process (tokens end with the process).
    token_secret: SecretStr | None = None
    token_secret_file: Path | None = None
    #: The ``retry:`` an EventSource is told: milliseconds before it reconnects.
    retry_ms: int = Field(1000, ge=100, le=60_000)

    _secret_file = field_validator("token_secret_file")(_existing_file)

    @model_validator(mode="after")
    def _secret_long_enough(self) -> Self:
        secret = self.token_secret_value
        if secret is not None and len(secret) < 32:
            raise ValueError(
                f"{env_name('view', 'token_secret')} (or its file) must have at least 32 characters"
            )
        return self

    @property
    def token_secret_value(self) -> str | None:
        """The view-token key (from the file if one is set), or None."""
        return _read_secret(self.token_secret, self.token_secret_file)


class CanarySettings(BaseModel):
    """The end-to-end canary (docs/operations.md, "Canary"; ``BRIDGE_CANARY__*``)."""

    model_config = _GROUP

    #: Every this many seconds, one probe event per owned events partition, written to a canary
    #: task and read back through the stream path. 0 (the default) turns it off; 10 is a sane
    #: value when on.
    interval_s: float = Field(0.0, ge=0)
    #: A probe not delivered on the stream path within this many seconds counts as lost.
    timeout_s: float = Field(5.0, gt=0)
    #: The canary tasks' TTL; each is replaced (and ended with a terminal status) at half of it,
    #: so the index gains a few tasks per partition a TTL, never one per probe.
    task_ttl_s: float = Field(3600.0, ge=2)


class ClientSettings(BaseModel):
    """What the bridge's own clients present (``bridge tail``; ``BRIDGE_CLIENT__*``)."""

    model_config = _GROUP

    #: The bearer token ``bridge tail`` presents (prefer this to --token: argv is visible).
    token: SecretStr | None = None


class Settings(BaseSettings):
    """All settings of the bridge, grouped by concern (docs/configuration.md lists them all)."""

    model_config = SettingsConfigDict(
        env_prefix="BRIDGE_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
        # A failed validation must not print the input: it may hold an inline password.
        hide_input_in_errors=True,
    )

    kafka: KafkaSettings = KafkaSettings()
    topics: TopicSettings = TopicSettings()
    tasks: TasksSettings = TasksSettings()
    #: Tools declared here, plus those of the named built-in packs (see bridge.workers.packs).
    tools: list[ToolSpec] = Field(default_factory=list)
    tool_packs: list[str] = Field(default_factory=list)
    server: ServerSettings = ServerSettings()
    auth: AuthSettings = AuthSettings()
    streams: StreamSettings = StreamSettings()
    replicas: ReplicaSettings = ReplicaSettings()
    #: The peer listener of the forwarded requests (``BRIDGE_PEERS__*``, :class:`PeerSettings`).
    peers: PeerSettings = PeerSettings()
    #: Crash fail-over and replay pacing (``BRIDGE_RECOVERY__*``, :class:`RecoverySettings`).
    recovery: RecoverySettings = RecoverySettings()
    #: Planned hand-over and warm standbys (``BRIDGE_HANDOVER__*``, :class:`HandoverSettings`).
    handover: HandoverSettings = HandoverSettings()
    webhooks: WebhookSettings = WebhookSettings()
    events: EventsSettings = EventsSettings()
    view: ViewSettings = ViewSettings()
    canary: CanarySettings = CanarySettings()
    client: ClientSettings = ClientSettings()
    #: OpenTelemetry tracing (off by default; ``BRIDGE_TRACING__*``).
    tracing: TracingSettings = TracingSettings()
    #: Task identity keys (``BRIDGE_IDENTITY__*``).
    identity: IdentitySettings = IdentitySettings()
    upgrade: UpgradeSettings = UpgradeSettings()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments over the environment over the TOML file (when one is named), each
        with the flat names of 0.1.0 moved to their groups (:mod:`bridge.settings_renames`)."""
        assert isinstance(init_settings, InitSettingsSource)
        renamed = rename_keys(init_settings.init_kwargs, "keyword argument")
        sources: list[PydanticBaseSettingsSource] = [
            InitSettingsSource(settings_cls, init_kwargs=renamed),
            _RenamedEnvSource(settings_cls),
        ]
        if settings_cls.model_config.get("toml_file") is not None:
            sources.append(_TomlFileSource(settings_cls))
        return tuple(sources)

    @model_validator(mode="after")
    def _event_sources_apart(self) -> Self:
        # Names must not shadow each other or the bridge's own event types, and a configured
        # source must not read the bridge's own topics: that would serve task events (and
        # webhook secrets) around the ownership checks.
        prefix = self.tasks.event_type_prefix
        own = {f"{prefix}.task.event", f"{prefix}.task.updated"}
        seen: set[str] = set()
        for source in self.events.sources:
            if source.name in own or source.name in seen:
                raise ValueError(f"events.sources: the name {source.name!r} is already taken")
            seen.add(source.name)
            if source.topic.startswith(f"{self.topics.prefix}."):
                raise ValueError(
                    f"events.sources: {source.name} reads {source.topic!r}, one of the bridge's "
                    f"own topics (prefix {self.topics.prefix!r}); name a pipeline's topic"
                )
        return self

    @model_validator(mode="after")
    def _group_can_forward(self) -> Self:
        if self.replicas.ownership != "group":
            return self
        group = f"{env_name('replicas', 'ownership')}=group"
        advertised = env_name("peers", "advertised_url")
        if self.peers.advertised_url is None:
            raise ValueError(
                f"{group} needs {advertised}: the URL other replicas forward requests to "
                "(e.g. http://bridge-0.bridge-peers:8081)"
            )
        try:
            url = self.peers.advertised_url
            self.peers.origin(url, self.peers.accepted_hosts(url))
        except ValueError as exc:
            raise ValueError(
                f"{advertised} must be this replica's peer listener "
                f"({self.peers.scheme}://<host>:{env_name('peers', 'port')}): {exc}"
            ) from None
        secret = self.peers.secret_value
        if secret is None or len(secret) < 32:
            raise ValueError(
                f"{group} needs a peer secret of at least 32 characters in "
                f"{env_name('peers', 'secret_file')} (or {env_name('peers', 'secret')}): it "
                "authenticates requests forwarded between replicas"
            )
        return self

    @property
    def type_rule(self) -> EventTypeRule:
        """The rule for vendor-prefixed event types, with ``tasks.accepted_event_prefixes``."""
        return _event_type_rule(tuple(self.tasks.accepted_event_prefixes))

    @property
    def own_types(self) -> TaskEventTypes:
        """The bridge's own event types under ``tasks.event_type_prefix``."""
        return TaskEventTypes.of(self.tasks.event_type_prefix)


class _RenamedEnvSource(EnvSettingsSource):
    """``BRIDGE_*`` variables, the flat names of 0.1.0 moved to their groups."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return rename_env(super()._load_env_vars(), self.env_prefix.lower())


class _TomlFileSource(TomlConfigSettingsSource):
    """The TOML file named by ``toml_file`` (pydantic-settings' source), which must exist and
    parse, with the flat keys of 0.1.0 moved to their groups."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        path = Path(str(settings_cls.model_config.get("toml_file")))
        # pydantic-settings skips a missing file quietly; a named one that is missing is a typo.
        if not path.is_file():
            raise ValueError(f"config file {path} does not exist")
        super().__init__(settings_cls, toml_file=path)

    def _read_file(self, file_path: Path | Traversable) -> dict[str, Any]:
        try:
            values = super()._read_file(file_path)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"config file {file_path} is not valid TOML: {exc}") from None
        return rename_keys(values, f"config file {file_path}")


@lru_cache(maxsize=8)
def _from_file(path: Path) -> type[Settings]:
    # The file's name rides on the class's config, where pydantic-settings' source looks for it.
    config = SettingsConfigDict(**{**Settings.model_config, "toml_file": path})
    return type("Settings", (Settings,), {"model_config": config, "__module__": __name__})


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build the settings: environment over file over defaults; ``overrides`` win over all.

    The file is ``config_file`` if given, else ``$BRIDGE_CONFIG_FILE`` if set. A plain
    ``KAFKA_BOOTSTRAP_SERVERS`` is used when no ``BRIDGE_`` variable names the cluster.
    Settings of 0.1.0 under their old names (environment, file or ``overrides``) are moved to
    their new places, with a deprecation warning (docs/configuration.md).
    """
    path = config_file or os.environ.get("BRIDGE_CONFIG_FILE")
    overrides = rename_keys(overrides, "keyword argument")
    plain = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    named = ("BRIDGE_KAFKA__BOOTSTRAP_SERVERS", "BRIDGE_KAFKA_BOOTSTRAP_SERVERS")
    if plain and not any(name in os.environ for name in named):
        kafka = overrides.setdefault("kafka", {})
        if isinstance(kafka, dict):
            kafka.setdefault("bootstrap_servers", plain)
    # Environment beats the file: pydantic-settings gives init kwargs the highest priority, and
    # the settings class places the file's source below the environment's.
    cls = _from_file(Path(path).expanduser().absolute()) if path else Settings
    return cls(**overrides)


def running_in_ci() -> bool:
    """True when the ``CI`` variable is set to anything but an empty/false value."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
