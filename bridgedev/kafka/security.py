"""The security layer of a secured local broker: its users, its certificates, the listener and
authorizer settings of ``server.properties``, the ``--add-scram`` arguments of the storage
format, and the :class:`~bridgedev.kafka.broker.SecureBrokerInfo` a client connects with.

One broker directory (``root``) holds it all: ``ca.pem`` (the CA clients trust),
``server.pem`` (the broker's PKCS#8 key and certificate chain, 0600) and ``users.json``
(``{name: password}``, 0600). :func:`new_security` creates them; :func:`load_security` reads
them back for a restart of the long-lived broker (SCRAM credentials live in the formatted
storage, so the passwords must outlive the process).

Development only: the passwords sit in files beside the storage, and OAUTHBEARER accepts any
unsigned token (Kafka's unsecured JWS validator). It starts no process and fetches nothing;
:mod:`bridgedev.kafka.kraft` writes what :meth:`BrokerSecurity.server_config` returns.
"""

from __future__ import annotations

import json
import re
import secrets
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridgedev.kafka.broker import KafkaProviderError, SecureBrokerInfo
from bridgedev.kafka.files import _write_atomic

#: The super user: the broker itself (inter-broker and broker-to-controller) and the tests' admin.
ADMIN_USER = "admin"
#: Every mechanism of the client listener; every user may use any of them with one password.
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
#: Names the certificate is valid for: the broker advertises 127.0.0.1; people type localhost.
CERT_HOSTS = ("localhost", "127.0.0.1")
#: A user name is also a JAAS option name (``user_<name>``) and an ``--add-scram`` field.
_USER_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
_OAUTH_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
_CLIENT_LISTENER = "SASL_SSL"


@dataclass(frozen=True)
class BrokerSecurity:
    """The users and the TLS files of one secured broker directory."""

    root: Path
    #: Every user, the admin included: ``{name: password}``.
    users: Mapping[str, str] = field(repr=False)

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.pem"

    @property
    def keystore_file(self) -> Path:
        return self.root / "server.pem"

    @property
    def admin_password(self) -> str:
        return self.users[ADMIN_USER]

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context that trusts this broker's CA only (hostname checked)."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    def server_config(self, port: int, cport: int) -> dict[str, str]:
        """Listeners, SASL, TLS and authorizer lines of ``server.properties``."""
        return {
            **self._listener_config(port, cport),
            **self._jaas_config(),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore_file),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{ADMIN_USER}",
        }

    def _listener_config(self, port: int, cport: int) -> dict[str, str]:
        # The broker talks to its own controller and to itself (transaction markers, for one)
        # as the admin, with PLAIN: its JAAS file holds that password, whereas SCRAM
        # credentials live in the metadata the controller serves, so they cannot authenticate
        # the broker to the controller. Authenticating even the loopback controller listener
        # (no TLS there) means no unauthenticated principal (User:ANONYMOUS) needs super-user
        # rights, so every client principal is subject to the ACLs under test.
        return {
            "listeners": f"{_CLIENT_LISTENER}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
            "advertised.listeners": f"{_CLIENT_LISTENER}://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": _CLIENT_LISTENER,
            "listener.security.protocol.map": (
                f"CONTROLLER:SASL_PLAINTEXT,{_CLIENT_LISTENER}:{_CLIENT_LISTENER}"
            ),
            "sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        }

    def _jaas_config(self) -> dict[str, str]:
        client = f"listener.name.{_CLIENT_LISTENER.lower()}"
        # Kafka's unsecured validator (the default without a JWKS endpoint) takes the
        # principal from the unsigned token's `sub`: anyone may claim any name. Development only.
        oauth = f'{_OAUTH_MODULE} required unsecuredLoginStringClaim_sub="{ADMIN_USER}";'
        return {
            f"{client}.plain.sasl.jaas.config": self._plain_jaas(self.users),
            f"{client}.scram-sha-256.sasl.jaas.config": f"{_SCRAM_MODULE} required;",
            f"{client}.scram-sha-512.sasl.jaas.config": f"{_SCRAM_MODULE} required;",
            f"{client}.oauthbearer.sasl.jaas.config": oauth,
            "listener.name.controller.plain.sasl.jaas.config": self._plain_jaas(
                {ADMIN_USER: self.admin_password}
            ),
        }

    def _plain_jaas(self, users: Mapping[str, str]) -> str:
        """PLAIN's JAAS line: the broker's own login (``username``) and the accepted users."""
        accepted = " ".join(f'user_{name}="{password}"' for name, password in users.items())
        own = f'username="{ADMIN_USER}" password="{self.admin_password}"'
        return f"{_PLAIN_MODULE} required {own} {accepted};"

    def scram_format_args(self) -> list[str]:
        """``kafka-storage format`` arguments creating every user's SCRAM credentials."""
        return [
            arg
            for name, password in self.users.items()
            for mechanism in SCRAM_MECHANISMS
            for arg in ("--add-scram", f"{mechanism}=[name={name},password={password}]")
        ]

    def info(
        self, bootstrap: str, detail: str, client_config: Path | None = None
    ) -> SecureBrokerInfo:
        """What a caller needs to connect to the broker of this directory at ``bootstrap``."""
        return SecureBrokerInfo(
            bootstrap,
            "local",
            detail,
            ca_file=self.ca_file,
            admin_user=ADMIN_USER,
            admin_password=self.admin_password,
            users=dict(self.users),
            client_config=client_config,
        )


def new_security(root: Path, users: Iterable[str] = ()) -> BrokerSecurity:
    """Fresh certificates and a random password for the admin and each of ``users``."""
    names = [ADMIN_USER, *(name for name in users if name != ADMIN_USER)]
    for name in names:
        _check_user_name(name)
    security = BrokerSecurity(root, {name: secrets.token_hex(16) for name in names})
    root.mkdir(parents=True, exist_ok=True)
    _write_certificates(security)
    _write_atomic(root / "users.json", json.dumps(dict(security.users), indent=1), private=True)
    return security


def load_security(root: Path) -> BrokerSecurity | None:
    """The security of ``root`` as :func:`new_security` left it; None if incomplete."""
    security_files = (root / "users.json", root / "ca.pem", root / "server.pem")
    if not all(path.is_file() for path in security_files):
        return None
    try:
        users = json.loads((root / "users.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(users, dict) or not isinstance(users.get(ADMIN_USER), str):
        return None
    return BrokerSecurity(root, {str(name): str(password) for name, password in users.items()})


def _check_user_name(name: str) -> None:
    if not _USER_NAME.fullmatch(name):
        raise KafkaProviderError(
            f"user name {name!r} is not 1-64 of A-Z, a-z, 0-9, '.', '_', '-' "
            "(it goes into the broker's JAAS configuration and its SCRAM credentials)"
        )


def _write_certificates(security: BrokerSecurity) -> None:
    """A CA (``ca.pem``) and a server key and certificate chain for :data:`CERT_HOSTS`."""
    try:
        import trustme  # only a secured broker needs it
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise KafkaProviderError(
            "the secured local broker needs the `trustme` package: pip install trustme"
        ) from exc
    ca = trustme.CA(organization_name="mcp-kafka-bridge local broker")
    leaf = ca.issue_cert(*CERT_HOSTS)
    ca.cert_pem.write_to_path(str(security.ca_file))
    chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
    keystore = (_pkcs8(leaf.private_key_pem.bytes()) + chain).decode("ascii")
    _write_atomic(security.keystore_file, keystore, private=True)


def _pkcs8(key_pem: bytes) -> bytes:
    """``key_pem`` as unencrypted PKCS#8 PEM, the one private-key form Kafka's PEM store reads
    (trustme writes the "traditional" OpenSSL form)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(key_pem, password=None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def write_client_config(info: SecureBrokerInfo, path: Path) -> None:
    """A TOML settings file (``bridge --config PATH``) connecting as the admin with
    SCRAM-SHA-512, and beside it ``<name>.password`` (0600), the password file it names."""
    password_file = path.with_suffix(".password")
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(password_file, info.admin_password, private=True)
    settings = info.client_settings(info.admin_user)
    sasl = settings["kafka"]["sasl"]
    del sasl["password"]
    sasl["password_file"] = str(password_file)
    _write_atomic(path, _CLIENT_CONFIG_HEADER.format(path=path) + _toml(settings))


_CLIENT_CONFIG_HEADER = """\
# The secured local broker's client settings, rewritten by every `bridge kafka start --secure`.
# Use them with `bridge --config {path} ...` or BRIDGE_CONFIG_FILE={path}.
"""


def _toml(values: Mapping[str, Any], table: str = "") -> str:
    """``values`` as TOML: its scalars, then a table for each mapping (``[kafka.sasl]``);
    JSON's string escapes are TOML's too."""
    scalars = [
        f"{key} = {json.dumps(v)}\n" for key, v in values.items() if not isinstance(v, Mapping)
    ]
    tables = [_table(f"{table}{key}", v) for key, v in values.items() if isinstance(v, Mapping)]
    return "".join(scalars + tables)


def _table(name: str, values: Mapping[str, Any]) -> str:
    # A table with only subtables (``[kafka]`` here) gets no header of its own.
    body = _toml(values, f"{name}.")
    has_scalars = any(not isinstance(v, Mapping) for v in values.values())
    return f"\n[{name}]\n{body}" if has_scalars else body
