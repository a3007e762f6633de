"""The deployment files: k8s/ rendered and validated offline, and the Dockerfile checked statically.

Every overlay is rendered with ``kustomize build`` and validated with ``kubeconform -strict``,
without any network, against JSON schemas on disk:

- Kubernetes' own kinds: the schemas bundled in the PyPI package kubernetes-validate, laid out
  for kubeconform by k8s/schemas/kubernetes_schemas.py, for the oldest and the newest
  Kubernetes version we support (``KUBERNETES_VERSIONS``);
- ServiceMonitor and PrometheusRule: k8s/schemas/*-monitoring-v1.json, generated from the PyPI
  package cloudcoil-models-prometheus-operator (models of the Prometheus Operator CRDs) by
  k8s/schemas/generate_crd_schemas.py;
- Strimzi KafkaUser: k8s/schemas/kafkauser-kafka-v1beta2.json, written by hand from Strimzi's
  KafkaUser schema reference (strict, and each ACL's operations must exist for its resource
  type); the ACLs of each KafkaUser are compared with bridge/kafka/acls.py for its role;
- Strimzi KafkaTopic: skipped by kubeconform (``-skip KafkaTopic``), because no package
  registry serves the Strimzi CRDs (they ship only in Strimzi's GitHub releases and Helm chart;
  Maven Central's io.strimzi:api jar has the model classes, and Strimzi's CRD generator is not
  published). Instead :data:`KAFKA_TOPIC_SCHEMA` below, written from the KafkaTopicSpec of
  io.strimzi:api 0.47.0 (Maven Central), checks their structure strictly, and the topics are
  compared with the topic layout the bridge itself would create (bridge.kafka.topics).

Besides the overlays, the secured-Kafka variant an overlay can pick instead of prod's
(components/kafka-mtls) is rendered on the base and checked the same way.

The tools come from ``make k8s-tools`` (k8s/install-tools.sh) into ``$K8S_TOOLS_DIR``. Without
them these tests skip, except under CI, where they fail.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from support.unavailable import unavailable

from bridge.config import HandoverSettings, Settings, load_settings
from bridge.kafka.acls import (
    ROLES,
    Access,
    Acl,
    Operation,
    PatternType,
    ResourceType,
    Role,
    role_acls,
)
from bridge.kafka.topics import topic_layout
from bridge.keyring import new_keyring_text, parse_keyring
from bridge.log.identity import load_keyring
from bridge.sealing import KeyRing
from bridge.server.app import tool_catalog
from bridge.server.auth import unauthenticated_exposure
from bridge.server.runner import GRACEFUL_SHUTDOWN_S
from bridge.workers.packs import PACKS, pack_tools

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "k8s"
OVERLAYS = ("dev", "prod")
NAME = "mcp-kafka-bridge"
TOOLS_DIR = Path(
    os.environ.get("K8S_TOOLS_DIR") or Path.home() / ".cache" / "mcp-kafka-bridge" / "k8s-tools"
)
CRD_SCHEMAS = "{{ .ResourceKind }}{{ .KindSuffix }}.json"


def _load_schema_tool() -> Any:
    spec = importlib.util.spec_from_file_location(
        "kubernetes_schemas", K8S / "schemas" / "kubernetes_schemas.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KUBERNETES_VERSIONS: tuple[str, ...] = _load_schema_tool().KUBERNETES_VERSIONS

# --- tools -------------------------------------------------------------------------------------


def _missing(reason: str) -> None:
    unavailable(reason + " (run `make k8s-tools`)")


@pytest.fixture(scope="session")
def kustomize() -> str:
    path = TOOLS_DIR / "bin" / "kustomize"
    if not os.access(path, os.X_OK):
        _missing(f"kustomize is not installed in {path.parent}")
    return str(path)


@pytest.fixture(scope="session")
def kubeconform() -> str:
    return kubeconform_path()


def kubeconform_path() -> str:
    """kubeconform and its offline schemas (tests/test_helm.py shares them), or skip/fail."""
    path = TOOLS_DIR / "bin" / "kubeconform"
    if not os.access(path, os.X_OK):
        _missing(f"kubeconform is not installed in {path.parent}")
    for version in KUBERNETES_VERSIONS:
        folder = TOOLS_DIR / "kubernetes-json-schema" / f"v{version}-standalone-strict"
        if not (folder / "_definitions.json").is_file():
            _missing(f"no Kubernetes {version} JSON schemas in {folder}")
    return str(path)


@functools.cache
def _build(kustomize: str, directory: Path) -> str:
    done = subprocess.run(
        [kustomize, "build", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"kustomize build {directory} failed:\n{done.stderr}"
    return done.stdout


def _docs(text: str) -> list[dict[str, Any]]:
    try:
        import yaml  # type: ignore[import-untyped]  # PyYAML ships no stubs
    except ImportError:
        _missing("PyYAML is not installed")
    return [doc for doc in yaml.safe_load_all(text) if doc]


@pytest.fixture(scope="session")
def rendered(kustomize: str) -> dict[str, list[dict[str, Any]]]:
    return {overlay: _docs(_build(kustomize, K8S / "overlays" / overlay)) for overlay in OVERLAYS}


def _kubeconform(kubeconform: str, text: str, version: str) -> list[dict[str, Any]]:
    """Per-resource results of ``kubeconform -strict``, offline."""
    done = subprocess.run(
        [
            kubeconform,
            "-strict",
            "-verbose",
            "-output=json",
            f"-kubernetes-version={version}",
            f"-schema-location={TOOLS_DIR / 'kubernetes-json-schema'}",
            f"-schema-location={K8S / 'schemas' / CRD_SCHEMAS}",
            # No registry serves the Strimzi CRDs: see the module docstring and KAFKA_TOPIC_SCHEMA.
            "-skip=KafkaTopic",
            "-",
        ],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout, f"kubeconform printed nothing: {done.stderr}"
    resources: list[dict[str, Any]] = json.loads(done.stdout)["resources"]
    return resources


def _failures(results: list[dict[str, Any]]) -> list[str]:
    return [
        f"{r['kind']} {r['name']}: {r['status']} {r['msg']}"
        for r in results
        if r["status"] not in ("statusValid", "statusSkipped")
    ]


# --- schema validation -------------------------------------------------------------------------


def _kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_is_valid_against_the_kubernetes_and_crd_schemas(
    kustomize: str, kubeconform: str, overlay: str, version: str
) -> None:
    text = _build(kustomize, K8S / "overlays" / overlay)
    results = _kubeconform(kubeconform, text, version)
    assert not _failures(results)
    skipped = sorted({r["kind"] for r in results if r["status"] == "statusSkipped"})
    assert skipped == ["KafkaTopic"]
    valid = {r["kind"] for r in results if r["status"] == "statusValid"}
    assert {
        "StatefulSet",
        "Deployment",
        "Service",
        "NetworkPolicy",
        "ServiceMonitor",
        "PrometheusRule",
    } <= valid
    assert ("KafkaUser" in valid) == (overlay == "prod")  # k8s/schemas/kafkauser-kafka-v1beta2
    assert len(results) == len(_docs(text))


def _with_component(directory: Path, resource: Path, component: str, **fields: str) -> Path:
    """A kustomization in ``directory``: ``resource`` plus ``k8s/components/<component>``."""

    def rel(path: Path) -> str:
        return os.path.relpath(path, directory)  # kustomize refuses absolute resource paths

    (directory / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        + "".join(f"{key}: {value}\n" for key, value in fields.items())
        + f"resources:\n  - {rel(resource)}\n"
        + f"components:\n  - {rel(K8S / 'components' / component)}\n"
    )
    return directory


def test_the_optional_streams_autoscaling_component_is_valid(
    kustomize: str, kubeconform: str, tmp_path: Path
) -> None:
    text = _build(
        kustomize, _with_component(tmp_path, K8S / "overlays" / "prod", "streams-autoscaling")
    )
    assert not _failures(_kubeconform(kubeconform, text, KUBERNETES_VERSIONS[-1]))
    (hpa,) = [d for d in _docs(text) if d["kind"] == "HorizontalPodAutoscaler"]
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    assert metrics["Pods"]["pods"]["metric"]["name"] == "bridge_streams_active"
    assert metrics["Resource"]["resource"]["name"] == "cpu"


def _first_acl(user: dict[str, Any]) -> dict[str, Any]:
    acl: dict[str, Any] = user["spec"]["authorization"]["acls"][0]
    return acl


def _read_on_a_transactional_id(acl: dict[str, Any]) -> None:
    acl["resource"] = {"type": "transactionalId", "name": "x", "patternType": "literal"}
    acl["operations"] = ["Read"]


@pytest.mark.parametrize(
    ("kind", "mistake"),
    [
        ("Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(imag="x")),
        ("StatefulSet", lambda d: d["spec"].update(serviceNam="bridge-peers")),
        ("Service", lambda d: d["spec"]["ports"][0].update(port="http")),
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(scrapeTimeut="10s")),
        ("PrometheusRule", lambda d: d["spec"].update(group=[])),
        ("HorizontalPodAutoscaler", lambda d: d["spec"].update(minReplica=1)),
        ("KafkaUser", lambda d: d["spec"]["authorization"].update(acl=[])),
        ("KafkaUser", lambda d: d["spec"]["authentication"].update(type="scram-sha-256")),
        ("KafkaUser", lambda d: _first_acl(d)["resource"].update(patternType="prefixed")),
        ("KafkaUser", lambda d: _first_acl(d).update(operations=["read"])),
        # Strimzi's deprecated singular form (the v1 API drops it).
        ("KafkaUser", lambda d: _first_acl(d).update(operation="Read")),
        # An operation Kafka does not have for the resource type: Read on a transactional id.
        ("KafkaUser", lambda d: _read_on_a_transactional_id(_first_acl(d))),
    ],
)
def test_the_validation_rejects_a_misspelt_or_mistyped_field(
    kubeconform: str, rendered: dict[str, list[dict[str, Any]]], kind: str, mistake: Any
) -> None:
    # A control for the test above: the schemas are found, and they are strict.
    doc = json.loads(json.dumps(next(d for d in rendered["prod"] if d["kind"] == kind)))
    mistake(doc)
    (result,) = _kubeconform(kubeconform, json.dumps(doc), KUBERNETES_VERSIONS[0])
    assert result["status"] == "statusInvalid", result


# Strimzi KafkaTopic (kafka.strimzi.io/v1beta2), from io.strimzi.api.kafka.model.topic.
# KafkaTopicSpec of io.strimzi:api 0.47.0: topicName, partitions (minimum 1), replicas
# (1..32767), config (map). Strict, like the checks above.
KAFKA_TOPIC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "kafka.strimzi.io/v1beta2"},
        "kind": {"const": "KafkaTopic"},
        "metadata": {
            "type": "object",
            "required": ["name", "labels"],
            "properties": {
                # A DNS-1123 subdomain, at most 253 characters.
                "name": {
                    "type": "string",
                    "maxLength": 253,
                    "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
                },
                "namespace": {"type": "string"},
                "labels": {
                    "type": "object",
                    "required": ["strimzi.io/cluster"],
                    "additionalProperties": {"type": "string"},
                },
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            },
            "additionalProperties": False,
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                # Kafka's own rule for topic names.
                "topicName": {"type": "string", "pattern": r"^[a-zA-Z0-9._-]{1,249}$"},
                "partitions": {"type": "integer", "minimum": 1},
                "replicas": {"type": "integer", "minimum": 1, "maximum": 32767},
                "config": {
                    "type": "object",
                    "additionalProperties": {"type": ["string", "integer", "number", "boolean"]},
                },
            },
        },
    },
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kafka_topics_are_well_formed_strimzi_resources(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    topics = _kind(rendered[overlay], "KafkaTopic")
    assert topics
    for topic in topics:
        jsonschema.validate(topic, KAFKA_TOPIC_SCHEMA)
    misspelt = {**topics[0], "spec": {**topics[0]["spec"], "partition": 6}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(misspelt, KAFKA_TOPIC_SCHEMA)
    names = [t["spec"]["topicName"] for t in topics]
    assert len(names) == len(set(names))


# --- topics ------------------------------------------------------------------------------------


def _config_map(docs: list[dict[str, Any]]) -> dict[str, str]:
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    data: dict[str, str] = config_map["data"]
    return data


def _kafka_port(docs: list[dict[str, Any]]) -> int:
    """The port of the Kafka listener the bridge connects to (9092 plain, 9093 TLS)."""
    return int(_config_map(docs)["BRIDGE_KAFKA__BOOTSTRAP_SERVERS"].rsplit(":", 1)[1])


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any]
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container


def _pod_name(workload: dict[str, Any], ordinal: int = 0) -> str:
    """The name of a pod of ``workload``: stable ``<name>-<ordinal>`` for a StatefulSet."""
    name: str = workload["metadata"]["name"]
    return f"{name}-{ordinal}" if workload["kind"] == "StatefulSet" else f"{name}-7d9f8-x2x4q"


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of ``$(NAME)`` from the variables defined before (else kept)."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), value)


def _env(docs: list[dict[str, Any]], workload: dict[str, Any], ordinal: int = 0) -> dict[str, str]:
    """The environment a container of the pod ``ordinal`` gets: its ConfigMap, then its own env
    in order, downward API fields resolved and ``$(NAME)`` references expanded."""
    container = _container(workload)
    fields = {
        "metadata.name": _pod_name(workload, ordinal),
        "metadata.namespace": workload["metadata"].get("namespace", "default"),
    }
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        env.update(_one(docs, "ConfigMap", name)["data"])
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = _expand(entry["value"], env)
        elif "fieldRef" in entry.get("valueFrom", {}):
            env[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


#: The Secret holding the replicas' shared secret (docs/deployment.md, "The peer secret").
PEER_SECRET = "mcp-kafka-bridge-peer"
#: The Secrets of the two keys kept outside Kafka (docs/deployment.md, "Secrets"): the task
#: identity keyring and the key file sealing webhook secrets at rest.
IDENTITY_SECRET = "mcp-kafka-bridge-identity"
WEBHOOK_KEYS_SECRET = "mcp-kafka-bridge-webhook-keys"
#: The keys of the Secrets the pods mount, as their makers create them: Strimzi's cluster CA
#: (Cluster Operator), the auth Secret of docs/deployment.md "Authentication", and the Secret the
#: User Operator makes for a KafkaUser, by the user's authentication type.
SECRET_KEYS = {
    "my-cluster-cluster-ca-cert": {"ca.crt", "ca.p12", "ca.password"},
    "mcp-kafka-bridge-auth": {"jwks.json"},
    PEER_SECRET: {"secret"},
    IDENTITY_SECRET: {"identity.keys"},
    WEBHOOK_KEYS_SECRET: {"keys.json"},
}
KAFKA_USER_SECRET_KEYS = {
    "scram-sha-512": {"password", "sasl.jaas.config"},
    "tls": {"ca.crt", "user.crt", "user.key", "user.p12", "user.password"},
}


def _secret_keys(docs: list[dict[str, Any]], name: str) -> set[str]:
    users = {u["metadata"]["name"]: u for u in _kind(docs, "KafkaUser")}
    if name in users:
        return KAFKA_USER_SECRET_KEYS[users[name]["spec"]["authentication"]["type"]]
    rendered = {s["metadata"]["name"]: s for s in _kind(docs, "Secret")}
    if name in rendered:
        return set(rendered[name].get("data", {})) | set(rendered[name].get("stringData", {}))
    assert name in SECRET_KEYS, f"a pod mounts the Secret {name}, which nothing here creates"
    return SECRET_KEYS[name]


def _secret_files(docs: list[dict[str, Any]], workload: dict[str, Any]) -> dict[str, str]:
    """The files a container sees from Secret volumes: path -> "<secret>/<key>"."""
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    files = {}
    for mount in _container(workload).get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        keys = _secret_keys(docs, secret["secretName"])
        for item in secret.get("items") or [{"key": key, "path": key} for key in keys]:
            assert item["key"] in keys, f"{secret['secretName']} has no key {item['key']}"
            files[f"{mount['mountPath']}/{item['path']}"] = f"{secret['secretName']}/{item['key']}"
    return files


@pytest.fixture
def settings_from(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """Load Settings exactly as a container would: from only its environment, with its files.

    Settings check at load that the files they name exist, so each Secret volume's files are
    staged under a fresh directory and the paths in the environment moved there: a setting that
    names a file no mount provides fails to load, as it would in the pod.
    """
    yield settings_loader(monkeypatch, tmp_path)


def _staged_content(path: str, source: str) -> str:
    """What a mounted Secret file holds in the test: a usable key where the bridge parses one at
    load (the identity keyring, the webhook key file), else a line naming its source."""
    if path.endswith("/identity.keys"):
        return new_keyring_text("staged")
    if path.endswith("/keys.json"):
        key = base64.b64encode(os.urandom(32)).decode()
        return json.dumps({"current": "staged", "keys": {"staged": key}})
    return f"staged {source}\n"


def settings_loader(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """What :func:`settings_from` yields (tests/test_helm.py shares it)."""
    pods = iter(range(1_000_000))

    def load(docs: list[dict[str, Any]], workload: dict[str, Any]) -> Settings:
        root = tmp_path / f"pod-{next(pods)}"
        for path, source in _secret_files(docs, workload).items():
            staged = root / path.lstrip("/")
            staged.parent.mkdir(parents=True, exist_ok=True)
            staged.write_text(_staged_content(path, source))
        for key in list(os.environ):
            if key.startswith("BRIDGE_") or key == "KAFKA_BOOTSTRAP_SERVERS":
                monkeypatch.delenv(key)
        for key, value in _env(docs, workload).items():
            staged = root / value.lstrip("/")
            monkeypatch.setenv(
                key, str(staged) if value.startswith("/") and staged.exists() else value
            )
        return load_settings()

    return load


def _workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What runs pods: the server's StatefulSet and the workers' Deployment."""
    return _kind(docs, "StatefulSet") + _kind(docs, "Deployment")


def _workload(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    (workload,) = [
        w
        for w in _workloads(docs)
        if w["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return workload


def _worker_packs(worker: dict[str, Any]) -> list[str]:
    args = _container(worker)["args"]
    assert args[0] == "workers"
    return [args[i + 1] for i, arg in enumerate(args) if arg == "--pack"]


def _job_topics(docs: list[dict[str, Any]], role: str, settings: Settings) -> list[str]:
    """The job topics a role uses here: the server's tools, the worker's packs' tools."""
    if role == "server":
        return [t.job_topic or settings.topics.jobs(t.name) for t in tool_catalog(settings)]
    if role == "worker":
        packs = _worker_packs(_workload(docs, "worker"))
        return [settings.topics.jobs(t.name) for t in pack_tools(packs)]
    return []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kafka_topics_are_the_layout_the_bridge_would_create(
    rendered: dict[str, list[dict[str, Any]]], overlay: str, settings_from: Any
) -> None:
    # The bridge runs with auto_create_topics false, so Strimzi must create exactly the topics
    # (names, partitions, replication, configs) that `bridge topics create` would.
    docs = rendered[overlay]
    server = _workload(docs, "server")
    settings = settings_from(docs, server)
    assert settings.topics.auto_create is False
    served = _job_topics(docs, "server", settings)
    worked = _job_topics(docs, "worker", settings)
    every_pack = [settings.topics.jobs(t.name) for t in pack_tools(sorted(PACKS))]
    assert set(served) | set(worked) <= set(every_pack)

    topics = {t["spec"]["topicName"]: t["spec"] for t in _kind(docs, "KafkaTopic")}
    layout = topic_layout(settings, every_pack)
    assert sorted(topics) == sorted(spec.name for spec in layout)
    for spec in layout:
        topic = topics[spec.name]
        assert topic["partitions"] == spec.partitions, spec.name
        assert topic["replicas"] == spec.replication_factor, spec.name
        assert {k: str(v) for k, v in topic["config"].items()} == spec.configs, spec.name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_events_topic_is_delete_only_and_the_index_topic_compacted(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    topics = {t["spec"]["topicName"]: t["spec"] for t in _kind(rendered[overlay], "KafkaTopic")}
    events = topics["mcpbridge.task-events"]["config"]
    assert events["cleanup.policy"] == "delete"  # never compact: seq counts a task's records
    assert int(events["retention.ms"]) > 0
    # Compacted: the index and the webhook subscriptions (the latest record of each key counts).
    compacted = {"mcpbridge.task-index", "mcpbridge.event-subscriptions"}
    for name in compacted:
        assert topics[name]["config"]["cleanup.policy"] == "compact", name
    for name, spec in topics.items():
        if name not in compacted:
            assert "compact" not in str(spec["config"]["cleanup.policy"]), name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_index_and_updates_topics_are_co_partitioned_with_the_events_topic(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    # The owner of events partition N persists to partition N of both: same count, same
    # retention for the updates as for the events they describe.
    topics = {t["spec"]["topicName"]: t["spec"] for t in _kind(rendered[overlay], "KafkaTopic")}
    events = topics["mcpbridge.task-events"]
    for name in ("mcpbridge.task-index", "mcpbridge.task-updates"):
        assert topics[name]["partitions"] == events["partitions"], name
    updates = topics["mcpbridge.task-updates"]["config"]
    assert updates["cleanup.policy"] == "delete"
    assert updates["retention.ms"] == events["config"]["retention.ms"]


# --- workloads ---------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_is_hardened_and_sized(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    workloads = _workloads(rendered[overlay])
    assert len(workloads) == 2
    for workload in workloads:
        name = workload["metadata"]["name"]
        pod = workload["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["serviceAccountName"] == NAME, name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] != 0, name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert not pod.get("hostNetwork") and not pod.get("hostPID"), name
        tmp = {v["name"]: v for v in pod["volumes"]}["tmp"]
        assert "emptyDir" in tmp, name
        for container in pod["containers"] + pod.get("initContainers", []):
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True, name
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context.get("privileged", False) is False, name
            assert context["capabilities"]["drop"] == ["ALL"], name
            assert "add" not in context["capabilities"], name
            assert context["seccompProfile"]["type"] == "RuntimeDefault", name
            assert {"mountPath": "/tmp", "name": "tmp"} in container["volumeMounts"], name
            for bound in ("requests", "limits"):
                assert set(container["resources"][bound]) >= {"cpu", "memory"}, name
            image = container["image"]
            assert re.search(r":[\w][\w.-]*$|@sha256:[0-9a-f]{64}$", image), image
            assert not image.endswith(":latest"), image


def test_prod_pins_a_released_image(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for workload in _workloads(rendered["prod"]):
        image = _container(workload)["image"]
        assert re.search(r":v?\d+\.\d+\.\d+$|@sha256:[0-9a-f]{64}$", image), image


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_server_probes_drains_and_spreads(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    server = _workload(docs, "server")
    pod = server["spec"]["template"]["spec"]
    container = _container(server)
    assert container["args"] == ["serve"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # The listener opens only after the index caught up (bounded by 300 s): startup covers it.
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/healthz"
    assert startup["periodSeconds"] * startup["failureThreshold"] > 300
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert {"name": "peer", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # preStop, the hand-over of the partitions, then the 10 s graceful drain of streams, with
    # time left to close Kafka clients.
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    handover = float(env.get("BRIDGE_HANDOVER__TIMEOUT_S") or HandoverSettings().timeout_s)
    assert pod["terminationGracePeriodSeconds"] > int(pre_stop[1]) + handover + GRACEFUL_SHUTDOWN_S
    assert pod.get("topologySpreadConstraints") or pod.get("affinity", {}).get("podAntiAffinity")
    # One pod at a time, the next only once the new one is ready (a StatefulSet cannot surge).
    assert server["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    expected = 1 if overlay == "dev" else 2
    assert server["spec"]["replicas"] >= expected


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_autoscaler_scales_the_statefulset_up_to_one_replica_per_events_partition(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    server = _workload(docs, "server")
    hpa = _one(docs, "HorizontalPodAutoscaler", NAME)
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": server["metadata"]["name"],
    }
    assert hpa["spec"]["minReplicas"] == server["spec"]["replicas"]
    # A replica beyond the partition count would own nothing.
    partitions = int(_config_map(docs)["BRIDGE_TOPICS__PARTITIONS"])
    assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"] <= partitions


def test_prod_keeps_two_replicas_through_disruptions(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    pdb = _one(rendered["prod"], "PodDisruptionBudget", NAME)
    assert pdb["spec"] == {"minAvailable": 2, "selector": pdb["spec"]["selector"]}
    assert _workload(rendered["prod"], "server")["spec"]["replicas"] > 2


#: The server's settings of "replicas divide the work" (docs/deployment.md, "Ownership and
#: failover"); BRIDGE_PEERS__SECRET (inline) is the discouraged alternative of the _FILE one.
OWNERSHIP_ENV = (
    "BRIDGE_REPLICAS__OWNERSHIP",
    "BRIDGE_REPLICAS__INSTANCE_ID",
    "BRIDGE_PEERS__ADVERTISED_URL",
    "BRIDGE_PEERS__SECRET_FILE",
    "BRIDGE_REPLICAS__SESSION_TIMEOUT_MS",
)
PEERS = "bridge-peers"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_index_writer_runs_the_server_replicas_divide_the_partitions(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    for workload in _workloads(docs):
        assert _container(workload)["args"][0] != "index", workload["metadata"]["name"]
        assert _role(workload) in {"server", "worker"}
        assert "BRIDGE_INDEX_WRITER" not in _env(docs, workload)
    assert not any("index-writer" in d["metadata"]["name"] for d in docs)
    server_env = _env(docs, _workload(docs, "server"))
    assert set(OWNERSHIP_ENV) <= set(server_env)
    assert server_env["BRIDGE_REPLICAS__OWNERSHIP"] == "group"
    assert "BRIDGE_PEERS__SECRET" not in server_env  # the file, never the value in the manifest
    # Only the server divides partitions: the workers keep their own consumer group.
    worker_env = _env(docs, _workload(docs, "worker"))
    assert not set(OWNERSHIP_ENV) & set(worker_env)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_server_is_a_parallel_statefulset_with_a_headless_peer_service(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    server = _workload(docs, "server")
    assert server["kind"] == "StatefulSet"
    assert server["spec"]["podManagementPolicy"] == "Parallel"
    assert not server["spec"].get("volumeClaimTemplates")  # nothing is kept on disk
    peers = _one(docs, "Service", server["spec"]["serviceName"])
    assert peers["metadata"]["name"] == PEERS
    assert peers["spec"]["clusterIP"] == "None"
    assert peers["spec"]["publishNotReadyAddresses"] is False  # only ready owners get requests
    (port,) = peers["spec"]["ports"]
    assert port["port"] == 8081 and port["targetPort"] == "peer"  # the peer listener only
    assert _selects(peers["spec"]["selector"], server["spec"]["template"]["metadata"]["labels"])
    assert not _selects(peers["spec"]["selector"], _pod_labels(_workload(docs, "worker")))
    client = _one(docs, "Service", NAME)
    assert client["spec"].get("clusterIP") != "None"
    # Prometheus scrapes each pod once: the ServiceMonitor's port is on the client Service only.
    monitor = _one(docs, "ServiceMonitor", NAME)
    scraped = [
        service["metadata"]["name"]
        for service in _kind(docs, "Service")
        if _selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
        for endpoint in monitor["spec"]["endpoints"]
        if endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    ]
    assert scraped == [NAME]


def _pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_replica_is_a_static_group_member_reachable_at_its_own_name(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    server = _workload(docs, "server")
    namespace = server["metadata"]["namespace"]
    peers = _one(docs, "Service", server["spec"]["serviceName"])
    (port,) = peers["spec"]["ports"]
    container_port = {p["name"]: p["containerPort"] for p in _container(server)["ports"]}
    urls = []
    for ordinal in range(2):
        env = _env(docs, server, ordinal)
        pod = f"{NAME}-{ordinal}"
        assert (
            env["BRIDGE_REPLICAS__INSTANCE_ID"] == pod
        )  # stable across restarts: the static member id
        url = urllib.parse.urlsplit(env["BRIDGE_PEERS__ADVERTISED_URL"])
        # The pod's DNS name under the headless Service, on the port it listens on.
        assert url.scheme == "http" and url.path in ("", "/")
        assert url.hostname == f"{pod}.{PEERS}.{namespace}.svc.cluster.local"
        assert url.port == port["port"] == container_port[port["targetPort"]]
        assert url.port == int(env["BRIDGE_PEERS__PORT"]) != container_port["http"]
        urls.append(url.geturl())
    assert len(set(urls)) == 2
    # Within what Kafka brokers accept by default (group.min/max.session.timeout.ms).
    timeout_ms = int(_env(docs, server)["BRIDGE_REPLICAS__SESSION_TIMEOUT_MS"])
    assert 6_000 <= timeout_ms <= 1_800_000


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_peer_secret_is_a_mounted_file_and_only_dev_ships_a_placeholder(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    server = _workload(docs, "server")
    secret_file = _env(docs, server)["BRIDGE_PEERS__SECRET_FILE"]
    source = _secret_files(docs, server)[secret_file]
    secret_name, key = source.split("/")
    assert key == "secret"
    secrets = _kind(docs, "Secret")
    if overlay == "prod":
        assert secret_name == PEER_SECRET and not secrets  # the operator's Secret
    else:
        (placeholder,) = [s for s in secrets if s["metadata"]["name"].startswith(PEER_SECRET)]
        assert secret_name == placeholder["metadata"]["name"]
        assert secret_name.startswith(f"{PEER_SECRET}-")  # kustomize's content hash
        value = base64.b64decode(placeholder["data"]["secret"]).decode()
        assert "placeholder" in value and "not-for-production" in value, value


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_server_mounts_both_keys_from_secrets_and_only_dev_ships_placeholders(
    rendered: dict[str, list[dict[str, Any]]], overlay: str, settings_from: Any
) -> None:
    docs = rendered[overlay]
    server = _workload(docs, "server")
    env, files = _env(docs, server), _secret_files(docs, server)
    sources = {
        IDENTITY_SECRET: files[env["BRIDGE_IDENTITY__KEYS_FILE"]],
        WEBHOOK_KEYS_SECRET: files[env["BRIDGE_WEBHOOKS__KEYS__FILE"]],
    }
    generated = {s["metadata"]["name"]: s for s in _kind(docs, "Secret")}
    for name, source in sources.items():
        secret_name, key = source.split("/")
        if overlay == "prod":
            assert secret_name == name and secret_name not in generated  # the operator's
            continue
        assert secret_name.startswith(f"{name}-")  # kustomize's content hash
        text = base64.b64decode(generated[secret_name]["data"][key]).decode()
        assert "placeholder-not-for-prod" in text, text
        if name == IDENTITY_SECRET:
            assert parse_keyring(text).current == "dev-placeholder-not-for-prod"
        else:
            assert json.loads(text)["current"] == "dev-placeholder-not-for-prod"
    # Only the server holds them: a worker (a pipeline) must never sign task identities.
    assert not any("KEYS" in name for name in _env(docs, _workload(docs, "worker")))
    # The server signs with the mounted keyring (never one derived from the peer secret or made
    # on a pod's disk) and seals webhook secrets with the mounted key file.
    settings = settings_from(docs, server)
    assert settings.identity.keys_file is not None and settings.webhooks.keys.file is not None
    assert load_keyring(settings).current == "staged"
    assert KeyRing.load(settings.webhooks.keys.file).current == "staged"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_role_loads_its_settings(
    rendered: dict[str, list[dict[str, Any]]], overlay: str, settings_from: Any
) -> None:
    docs = rendered[overlay]
    namespace = _workload(docs, "server")["metadata"]["namespace"]
    for workload in _workloads(docs):
        settings = settings_from(docs, workload)
        assert settings.kafka.bootstrap_servers == f"my-cluster-kafka-bootstrap:{_kafka_port(docs)}"
        assert settings.topics.auto_create is False
    server = settings_from(docs, _workload(docs, "server"))
    assert server.server.host == "0.0.0.0" and server.server.port == 8080
    # DNS rebinding protection: the names clients use for the Service must be allowed.
    for host in (NAME, f"{NAME}.{namespace}.svc", f"{NAME}.{namespace}.svc.cluster.local"):
        assert host in server.server.allowed_hosts, host
    assert "*" not in server.server.allowed_hosts
    pack_tools(_worker_packs(_workload(docs, "worker")))  # the packs exist


def test_prod_authenticates_with_a_secret_mounted_read_only(
    rendered: dict[str, list[dict[str, Any]]], settings_from: Any
) -> None:
    docs = rendered["prod"]
    server = _workload(docs, "server")
    settings = settings_from(docs, server)
    assert settings.auth.mode == "jwt"
    assert settings.auth.jwks_file is not None
    jwks = _env(docs, server)["BRIDGE_AUTH__JWKS_FILE"]
    assert _secret_files(docs, server)[jwks] == "mcp-kafka-bridge-auth/jwks.json"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_s_server_passes_the_bridge_s_own_start_checks(
    rendered: dict[str, list[dict[str, Any]]], overlay: str, settings_from: Any
) -> None:
    docs = rendered[overlay]
    settings = settings_from(docs, _workload(docs, "server"))
    assert settings.server.host == "0.0.0.0"
    assert unauthenticated_exposure(settings) is None
    if overlay == "prod":
        assert settings.auth.mode == "jwt"
        assert settings.auth.jwt_audience and settings.auth.jwt_issuer
        assert settings.kafka.security_protocol == "SASL_SSL"
    else:
        # The insecure choices, each written out in the overlay, never a silent default.
        config = _config_map(docs)
        assert config["BRIDGE_AUTH__MODE"] == "none"
        assert config["BRIDGE_AUTH__ALLOW_UNAUTHENTICATED"] == "true"
        assert config["BRIDGE_KAFKA__SECURITY_PROTOCOL"] == "PLAINTEXT"


def test_the_base_alone_refuses_to_start_until_an_overlay_chooses(
    kustomize: str, secured: dict[str, list[dict[str, Any]]], settings_from: Any
) -> None:
    # Kafka: SASL_SSL without a mechanism; every role refuses, naming what to set.
    base = _docs(_build(kustomize, K8S / "base"))
    for workload in _workloads(base):
        with pytest.raises(ValueError, match="BRIDGE_KAFKA__SASL__MECHANISM"):
            settings_from(base, workload)
    # Callers: with Kafka chosen (components/kafka-mtls) but no auth, serving is refused.
    docs = secured["kafka-mtls"]
    settings = settings_from(docs, _workload(docs, "server"))
    assert settings.auth.mode == "none"
    problem = unauthenticated_exposure(settings)
    assert problem is not None and "BRIDGE_AUTH__ALLOW_UNAUTHENTICATED=true" in problem


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_secret_is_mounted_read_only_and_readable_by_the_pod_only(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    for workload in _workloads(rendered[overlay]):
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        for mount in _container(workload).get("volumeMounts", []):
            secret = volumes[mount["name"]].get("secret")
            if secret is not None:
                assert mount["readOnly"] is True, mount
                assert secret["defaultMode"] & 0o007 == 0, secret  # nothing for "others"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_is_in_the_repository(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    # Only dev's generated placeholders (checked above) are rendered.
    rendered_secrets = sorted(s["metadata"]["name"] for s in _kind(docs, "Secret"))
    placeholders = (IDENTITY_SECRET, PEER_SECRET, WEBHOOK_KEYS_SECRET) if overlay == "dev" else ()
    assert len(rendered_secrets) == len(placeholders)
    assert all(n.startswith(f"{p}-") for n, p in zip(rendered_secrets, placeholders, strict=True))
    for key, value in _config_map(docs).items():
        if re.search(r"TOKEN|SECRET|PASSWORD", key):
            # Only where a mounted Secret holds it (BRIDGE_KAFKA__SASL__PASSWORD_FILE).
            assert key.endswith("_FILE") and value.startswith("/etc/mcp-kafka-bridge/"), key
        assert not re.search(r"-----BEGIN|eyJ[\w-]{10,}\.", value), key


# --- secured Kafka -----------------------------------------------------------------------------

#: How each rendering authenticates to Kafka: overlays/prod (with components/kafka-scram), and
#: the base with components/kafka-mtls, the variant an overlay can choose instead.
SECURED = {"prod": "scram-sha-512", "kafka-mtls": "tls"}
#: The roles with a KafkaUser: the server's and the workers' workloads, and pipelines of your own.
KAFKA_USER_ROLES: set[Role] = {"server", "worker", "pipeline"}
CLUSTER_CA = "my-cluster-cluster-ca-cert"
#: Strimzi's names (AclRule schema reference) for bridge.kafka.acls' resource and pattern types.
STRIMZI_RESOURCE_TYPES = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactionalId": ResourceType.TRANSACTIONAL_ID,
    "cluster": ResourceType.CLUSTER,
}
STRIMZI_PATTERN_TYPES = {"literal": PatternType.LITERAL, "prefix": PatternType.PREFIXED}


@pytest.fixture(scope="session")
def secured_text(kustomize: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    mtls = tmp_path_factory.mktemp("kafka-mtls")
    _with_component(mtls, K8S / "base", "kafka-mtls", namespace="mcp-bridge")
    return {
        "prod": _build(kustomize, K8S / "overlays" / "prod"),
        "kafka-mtls": _build(kustomize, mtls),
    }


@pytest.fixture(scope="session")
def secured(secured_text: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    return {variant: _docs(text) for variant, text in secured_text.items()}


def _kafka_user(docs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    """The KafkaUser of a role of bridge.kafka.acls: its app.kubernetes.io/component, as on the
    workload that runs as it ("pipeline" stands for pipelines of your own)."""
    (user,) = [
        u
        for u in _kind(docs, "KafkaUser")
        if u["metadata"]["labels"]["app.kubernetes.io/component"] == role
    ]
    return user


def _role(workload: dict[str, Any]) -> str:
    role: str = workload["metadata"]["labels"]["app.kubernetes.io/component"]
    return role


def test_the_kafka_mtls_variant_is_valid(kubeconform: str, secured_text: dict[str, str]) -> None:
    # overlays/prod, with kafka-scram, is validated with every overlay above.
    for version in KUBERNETES_VERSIONS:
        results = _kubeconform(kubeconform, secured_text["kafka-mtls"], version)
        assert not _failures(results)
        valid = [r["kind"] for r in results if r["status"] == "statusValid"]
        assert valid.count("KafkaUser") == len(KAFKA_USER_ROLES)


@pytest.mark.parametrize("variant", SECURED)
def test_every_role_has_a_kafka_user_of_the_chosen_authentication(
    secured: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    docs = secured[variant]
    users = _kind(docs, "KafkaUser")
    # One per workload's role and one for pipelines of your own; no index writer any more.
    roles = {u["metadata"]["labels"]["app.kubernetes.io/component"] for u in users}
    assert roles == {_role(w) for w in _workloads(docs)} | {"pipeline"} == KAFKA_USER_ROLES
    assert roles <= set(ROLES)
    assert len(users) == len(KAFKA_USER_ROLES)
    bootstrap = _config_map(docs)["BRIDGE_KAFKA__BOOTSTRAP_SERVERS"]
    for user in users:
        # Managed by the User Operator of the cluster the bridge connects to.
        cluster = user["metadata"]["labels"]["strimzi.io/cluster"]
        assert bootstrap.startswith(f"{cluster}-kafka-bootstrap:")
        assert user["metadata"]["name"] == f"{NAME}-{_role(user)}"
        assert user["spec"]["authentication"] == {"type": SECURED[variant]}
        assert user["spec"]["authorization"]["type"] == "simple"


@pytest.mark.parametrize("variant", SECURED)
def test_each_role_connects_over_tls_as_its_own_kafka_user(
    secured: dict[str, list[dict[str, Any]]], variant: str, settings_from: Any
) -> None:
    docs = secured[variant]
    workloads = _workloads(docs)
    assert {_role(w) for w in workloads} == KAFKA_USER_ROLES - {"pipeline"}
    for workload in workloads:
        # Loading fails if a file setting names a file that no mounted Secret key provides.
        settings = settings_from(docs, workload)
        env = _env(docs, workload)
        files = _secret_files(docs, workload)
        user = _kafka_user(docs, _role(workload))["metadata"]["name"]
        # The broker's certificate is checked against Strimzi's cluster CA, hostname included.
        assert settings.kafka.bootstrap_servers == "my-cluster-kafka-bootstrap:9093"
        assert files[env["BRIDGE_KAFKA__TLS__CA_FILE"]] == f"{CLUSTER_CA}/ca.crt"
        assert settings.kafka.tls.check_hostname is True
        # The pod sees its own user's Secret and nothing of any other user's.
        users = {u["metadata"]["name"] for u in _kind(docs, "KafkaUser")}
        mounted = {source.split("/")[0] for source in files.values()} & users
        assert mounted == {user}, workload["metadata"]["name"]
        if SECURED[variant] == "scram-sha-512":
            assert settings.kafka.security_protocol == "SASL_SSL"
            assert settings.kafka.sasl.mechanism == "SCRAM-SHA-512"
            assert settings.kafka.sasl.username == user
            assert files[env["BRIDGE_KAFKA__SASL__PASSWORD_FILE"]] == f"{user}/password"
            needed = {f"{user}/password"}
        else:
            assert settings.kafka.security_protocol == "SSL"
            assert not settings.kafka.sasl.configured
            assert files[env["BRIDGE_KAFKA__TLS__CERT_FILE"]] == f"{user}/user.crt"
            assert files[env["BRIDGE_KAFKA__TLS__KEY_FILE"]] == f"{user}/user.key"
            needed = {f"{user}/user.crt", f"{user}/user.key"}
        # Only the keys the client reads (not user.p12 and its password, nor sasl.jaas.config).
        assert {s for s in files.values() if s.startswith(f"{user}/")} == needed


def _strimzi_acls(user: dict[str, Any]) -> list[Acl]:
    """A KafkaUser's ACL rules as bridge.kafka.acls ACLs, one per operation."""
    acls = []
    for rule in user["spec"]["authorization"]["acls"]:
        # Only ALLOW from any host, as bridge.kafka.acls creates them.
        assert rule.get("type", "allow") == "allow" and rule.get("host", "*") == "*", rule
        resource = rule["resource"]
        for operation in rule["operations"]:
            acls.append(
                Acl(
                    STRIMZI_RESOURCE_TYPES[resource["type"]],
                    resource.get("name", "kafka-cluster"),
                    Operation[re.sub(r"(?<!^)(?=[A-Z])", "_", operation).upper()],
                    STRIMZI_PATTERN_TYPES[resource.get("patternType", "literal")],
                )
            )
    return acls


@pytest.mark.parametrize("variant", SECURED)
def test_kafka_users_carry_exactly_the_acls_of_their_role(
    secured: dict[str, list[dict[str, Any]]], variant: str, settings_from: Any
) -> None:
    docs = secured[variant]
    for role in sorted(KAFKA_USER_ROLES):
        # A role's own workload's settings; the pipeline's topics are the server's.
        runs_as = _workload(docs, "server" if role == "pipeline" else role)
        settings = settings_from(docs, runs_as)
        expected = _expected_acls(role, settings, _job_topics(docs, role, settings))
        granted = _strimzi_acls(_kafka_user(docs, role))
        assert len(granted) == len(set(granted)), f"{role}: an ACL listed twice"
        assert sorted(granted) == sorted(expected), role


def _expected_acls(role: Role, settings: Settings, job_topics: list[str]) -> list[Acl]:
    """What the process running as ``role`` needs: for the server, what `bridge serve` checks at
    start with the server's own settings (an owner of partitions persists their index)."""
    if role == "server":
        return Access.serving(settings, job_topics, workers=False).acls(settings.topics)
    return role_acls(role, settings.topics, job_topics)


@pytest.mark.parametrize("variant", SECURED)
def test_the_server_user_may_join_the_group_fence_per_partition_and_write_the_updates(
    secured: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    granted = set(_strimzi_acls(_kafka_user(secured[variant], "server")))
    prefix = "mcpbridge"
    T, G, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
    assert {
        Acl(G, f"{prefix}.bridge", Operation.READ),  # the replicas' consumer group
        # <prefix>.index.<partition>: whoever owns a partition fences its previous owner
        Acl(X, f"{prefix}.index.", Operation.WRITE, PatternType.PREFIXED),
        Acl(T, f"{prefix}.task-updates", Operation.WRITE),
        Acl(G, f"{prefix}.webhooks", Operation.READ),  # the webhook deliverers' group
        Acl(T, f"{prefix}.task-index", Operation.READ),
        Acl(T, f"{prefix}.task-index", Operation.WRITE),
    } <= granted
    # The single writer's literal id is gone with the index-writer Deployment.
    assert not any(acl.name == f"{prefix}.indexer" for acl in granted)


def test_dev_connects_in_plaintext_and_creates_no_kafka_users(
    rendered: dict[str, list[dict[str, Any]]], settings_from: Any
) -> None:
    docs = rendered["dev"]
    assert not _kind(docs, "KafkaUser")
    for workload in _workloads(docs):
        settings = settings_from(docs, workload)
        assert settings.kafka.bootstrap_servers == "my-cluster-kafka-bootstrap:9092"
        assert settings.kafka.security_protocol == "PLAINTEXT"
        assert not settings.kafka.tls.configured and not settings.kafka.sasl.configured
        # No Kafka credentials; the server mounts only the peer secret and its two keys.
        mounted = {source.split("/")[0] for source in _secret_files(docs, workload).values()}
        ours = tuple(f"{p}-" for p in (PEER_SECRET, IDENTITY_SECRET, WEBHOOK_KEYS_SECRET))
        assert all(name.startswith(ours) for name in mounted)


# --- labels and selectors ----------------------------------------------------------------------


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_labels_and_selectors(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    docs = rendered[overlay]
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == NAME, doc["metadata"]["name"]
        assert labels["app.kubernetes.io/part-of"] == NAME, doc["metadata"]["name"]
    pods = {}
    for workload in _workloads(docs):
        template = _pod_labels(workload)
        selector = workload["spec"]["selector"]["matchLabels"]
        assert {"app.kubernetes.io/name", "app.kubernetes.io/component"} <= set(selector)
        assert _selects(selector, template)
        assert template["app.kubernetes.io/part-of"] == NAME
        pods[template["app.kubernetes.io/component"]] = template
    assert set(pods) == {"server", "worker"}

    def selected(selector: dict[str, str]) -> set[str]:
        return {component for component, labels in pods.items() if _selects(selector, labels)}

    service = _one(docs, "Service", NAME)
    assert selected(service["spec"]["selector"]) == {"server"}
    assert selected(_one(docs, "Service", PEERS)["spec"]["selector"]) == {"server"}
    assert selected(_one(docs, "PodDisruptionBudget", NAME)["spec"]["selector"]["matchLabels"]) == {
        "server"
    }
    monitor = _one(docs, "ServiceMonitor", NAME)
    assert _selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {
        p["name"] for p in service["spec"]["ports"]
    }
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


#: The server's pods, as the NetworkPolicies name them (written out, not added by kustomize).
SERVER_PODS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": "server"}


def _only_server_pods(peers: list[dict[str, Any]]) -> bool:
    return all(
        p.keys() == {"podSelector"} and p["podSelector"] == {"matchLabels": SERVER_PODS}
        for p in peers
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_allow_kafka_dns_the_mcp_port_replicas_and_public_https_only(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    policies = _kind(rendered[overlay], "NetworkPolicy")
    kafka_port = _kafka_port(rendered[overlay])
    peer_port = {
        p["name"]: p["containerPort"]
        for p in _container(_workload(rendered[overlay], "server"))["ports"]
    }["peer"]
    egress_peers = []
    ingress_ports = []
    to_kafka: set[int] = set()
    between_replicas = {"ingress": 0, "egress": 0}
    webhooks = 0
    for policy in policies:
        spec = policy["spec"]
        assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == NAME
        # Rules of a direction the policy does not declare in policyTypes are ignored.
        assert ("egress" in spec) <= ("Egress" in spec["policyTypes"]), policy["metadata"]["name"]
        assert ("ingress" in spec) <= ("Ingress" in spec["policyTypes"]), policy["metadata"]["name"]
        for rule in spec.get("egress", []):
            ports = {p["port"] for p in rule["ports"]}
            if _only_server_pods(rule["to"]):
                # A replica forwarding to the owner of a partition: server to server, peer port.
                assert spec["podSelector"]["matchLabels"] == SERVER_PODS
                assert ports == {peer_port}
                between_replicas["egress"] += 1
                continue
            if all("ipBlock" in peer for peer in rule["to"]):
                # Webhook deliveries: server pods only, https only, never a private range.
                assert spec["podSelector"]["matchLabels"] == SERVER_PODS
                assert ports == {443}
                blocks = {
                    peer["ipBlock"]["cidr"]: set(peer["ipBlock"]["except"]) for peer in rule["to"]
                }
                assert {"10.0.0.0/8", "169.254.0.0/16", "127.0.0.0/8"} <= blocks["0.0.0.0/0"]
                assert {"fc00::/7", "fe80::/10"} <= blocks["::/0"]
                webhooks += 1
                continue
            egress_peers += rule["to"]
            assert ports <= {kafka_port, 53}
            if any("strimzi.io/cluster" in p["podSelector"]["matchLabels"] for p in rule["to"]):
                to_kafka |= ports
        for rule in spec.get("ingress", []):
            ports = {p["port"] for p in rule["ports"]}
            ingress_ports += ports
            assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "server"
            between_replicas["ingress"] += _only_server_pods(rule["from"])
            # The peer port is opened to server pods only, in a rule of its own.
            assert ("peer" in ports) <= (_only_server_pods(rule["from"]) and ports == {"peer"})
    assert set(ingress_ports) == {"http", "peer"}
    assert between_replicas == {"ingress": 1, "egress": 1}
    assert webhooks == 1
    # Peers must keep their own labels: the kustomize `labels` must not have reached them.
    for peer in egress_peers:
        assert not any(
            k.startswith("app.kubernetes.io/") for k in peer["podSelector"]["matchLabels"]
        )
    kafka = [p for p in egress_peers if "strimzi.io/cluster" in p["podSelector"]["matchLabels"]]
    assert kafka and any("k8s-app" in p["podSelector"]["matchLabels"] for p in egress_peers)
    assert to_kafka == {kafka_port}  # the listener the settings name, and only that one


def test_the_service_account_mounts_no_token(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for docs in rendered.values():
        assert _one(docs, "ServiceAccount", NAME)["automountServiceAccountToken"] is False


# --- the image ---------------------------------------------------------------------------------


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            instruction, _, args = line.strip().partition(" ")
            out.append((instruction.upper(), args.strip()))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction, args in _dockerfile():
        if instruction == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction, args))
    return stages


def test_the_dockerfile_builds_in_stages_and_runs_unprivileged() -> None:
    instructions = _dockerfile()
    args = dict(a.split("=", 1) for i, a in instructions if i == "ARG" and "=" in a)
    assert args.get("PYTHON_IMAGE") == "python:3.11-slim"
    build, runtime = _stages()
    assert build[0][1].endswith("AS build") and runtime[0][1].endswith("AS runtime")
    users = [a for i, a in runtime if i == "USER"]
    assert users, "the runtime stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can verify it
    assert f"runAsUser: {uid}" in (K8S / "base" / "pod-hardening.yaml").read_text()
    assert ("ENTRYPOINT", '["bridge"]') in runtime
    assert ("CMD", '["serve"]') in runtime
    assert ("EXPOSE", "8080") in runtime
    assert any(i == "COPY" and a.startswith("--from=build") for i, a in runtime)


def test_the_image_carries_the_avro_schema_and_checks_it_at_build_time() -> None:
    build, runtime = _stages()
    copies = [a.split()[0] for i, a in build if i == "COPY"]
    assert "schemas/" in copies and "bridge/" in copies
    # The package finds the schema in <package>/schemas (bridge/envelope.py _schema_dirs),
    # which is a symlink to schemas/ packaged as package data.
    link = ROOT / "bridge" / "schemas"
    assert link.is_symlink() or link.is_dir()
    assert (link / "task_event.avsc").is_file()
    assert any(i == "RUN" and "encode_event" in a for i, a in runtime)


def test_docker_run_with_the_image_s_defaults_refuses_to_serve_unauthenticated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The image listens on 0.0.0.0 (a container's address); auth mode none there is refused
    # unless BRIDGE_AUTH__ALLOW_UNAUTHENTICATED=true is given to `docker run -e`.
    _, runtime = _stages()
    env = dict(
        pair.split("=", 1) for i, a in runtime if i == "ENV" for pair in a.split() if "=" in pair
    )
    assert env["BRIDGE_SERVER__HOST"] == "0.0.0.0"
    for key in list(os.environ):
        if key.startswith("BRIDGE_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    problem = unauthenticated_exposure(load_settings())
    assert problem is not None and "BRIDGE_AUTH__ALLOW_UNAUTHENTICATED=true" in problem
    monkeypatch.setenv("BRIDGE_AUTH__ALLOW_UNAUTHENTICATED", "true")
    assert unauthenticated_exposure(load_settings()) is None


def test_the_dockerfile_holds_no_secrets_and_the_context_excludes_them() -> None:
    for instruction, args in _dockerfile():
        if instruction in ("ENV", "ARG", "LABEL"):
            assert not re.search(r"(PASSWORD|TOKEN|SECRET|API_KEY|PRIVATE)", args, re.I), args
        if instruction in ("COPY", "ADD"):
            assert not re.search(r"\.env\b|\.pem\b|\.key\b|id_rsa|kubeconfig", args), args
            assert instruction == "COPY", "ADD fetches and unpacks: use COPY"
    ignore = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*"  # an allow-list: everything out, then what the build copies
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    build, _ = _stages()
    for instruction, args in build:
        if instruction == "COPY" and not args.startswith("--from"):
            for source in args.split()[:-1]:
                assert source.rstrip("/") in allowed, source
    assert not allowed & {".venv", ".git", ".env", "tests", "k8s", "data"}


@pytest.mark.slow
def test_the_image_build_steps_install_a_package_that_finds_its_schema(tmp_path: Path) -> None:
    # No Docker engine here: replay the build stage's COPY + `pip install .` outside the repo
    # (symlinks kept, as COPY keeps them), then use the installed package from elsewhere.
    context = tmp_path / "src"
    context.mkdir()
    build, _ = _stages()
    for instruction, args in build:
        if instruction == "COPY":
            for source in args.split()[:-1]:
                path = ROOT / source
                if path.is_dir():
                    shutil.copytree(
                        path,
                        context / source,
                        symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"),
                    )
                else:
                    shutil.copy2(path, context / source)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(context)],
        check=True,
        timeout=300,
        env=env,
    )
    target = tmp_path / "installed"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target)]
        + [str(w) for w in wheels.glob("*.whl")],
        check=True,
        timeout=300,
        env=env,
    )
    probe = (
        "import bridge, bridge.envelope as e; print(bridge.__file__); "
        "print(e.encode_event(e.TaskEvent('a.b.c', {}))[0][:2].hex())"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    where, magic = done.stdout.split()
    assert Path(where).is_relative_to(target)  # not the editable checkout
    assert magic == "c301"  # Avro single-object encoding: the schema was found
