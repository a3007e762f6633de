"""The deployment files: k8s/ rendered and validated offline, and the Dockerfile checked statically.

Every overlay is rendered with ``kustomize build`` and validated with ``kubeconform -strict``,
without any network, against JSON schemas on disk:

- Kubernetes' own kinds: the schemas bundled in the PyPI package kubernetes-validate, laid out
  for kubeconform by k8s/schemas/kubernetes_schemas.py, for the oldest and the newest
  Kubernetes version we support (``KUBERNETES_VERSIONS``);
- ServiceMonitor and PrometheusRule: k8s/schemas/*-monitoring-v1.json, generated from the PyPI
  package cloudcoil-models-prometheus-operator (models of the Prometheus Operator CRDs) by
  k8s/schemas/generate_crd_schemas.py;
- Strimzi KafkaTopic: skipped by kubeconform (``-skip KafkaTopic``), because no package
  registry serves the Strimzi CRDs (they ship only in Strimzi's GitHub releases and Helm chart;
  Maven Central's io.strimzi:api jar has the model classes, and Strimzi's CRD generator is not
  published). Instead :data:`KAFKA_TOPIC_SCHEMA` below, written from the KafkaTopicSpec of
  io.strimzi:api 0.47.0 (Maven Central), checks their structure strictly, and the topics are
  compared with the topic layout the bridge itself would create (bridge.kafka.topics).

The tools come from ``make k8s-tools`` (k8s/install-tools.sh) into ``$K8S_TOOLS_DIR``. Without
them these tests skip, except under CI, where they fail.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from bridge.config import Settings, load_settings, running_in_ci
from bridge.kafka.topics import topic_layout
from bridge.server.app import tool_catalog
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
    reason += " (run `make k8s-tools`)"
    if running_in_ci():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def kustomize() -> str:
    path = TOOLS_DIR / "bin" / "kustomize"
    if not os.access(path, os.X_OK):
        _missing(f"kustomize is not installed in {path.parent}")
    return str(path)


@pytest.fixture(scope="session")
def kubeconform() -> str:
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
        import yaml
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
    assert {"Deployment", "Service", "NetworkPolicy", "ServiceMonitor", "PrometheusRule"} <= valid
    assert len(results) == len(_docs(text))


def test_the_optional_streams_autoscaling_component_is_valid(
    kustomize: str, kubeconform: str, tmp_path: Path
) -> None:
    def rel(path: Path) -> str:
        return os.path.relpath(path, tmp_path)  # kustomize refuses absolute resource paths

    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {rel(K8S / 'overlays' / 'prod')}\n"
        f"components:\n  - {rel(K8S / 'components' / 'streams-autoscaling')}\n"
    )
    text = _build(kustomize, tmp_path)
    assert not _failures(_kubeconform(kubeconform, text, KUBERNETES_VERSIONS[-1]))
    (hpa,) = [d for d in _docs(text) if d["kind"] == "HorizontalPodAutoscaler"]
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert metrics["Pods"]["pods"]["metric"]["name"] == "bridge_streams_active"
    assert metrics["Resource"]["resource"]["name"] == "cpu"


@pytest.mark.parametrize(
    ("kind", "mistake"),
    [
        ("Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(imag="x")),
        ("Service", lambda d: d["spec"]["ports"][0].update(port="http")),
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(scrapeTimeut="10s")),
        ("PrometheusRule", lambda d: d["spec"].update(group=[])),
        ("HorizontalPodAutoscaler", lambda d: d["spec"].update(minReplica=1)),
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


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _env(docs: list[dict[str, Any]], deployment: dict[str, Any]) -> dict[str, str]:
    """The BRIDGE_* environment a container gets: its ConfigMap, then its own env on top."""
    container = _container(deployment)
    env = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        env.update(_one(docs, "ConfigMap", name)["data"])
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    return env


@pytest.fixture
def settings_from(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Load Settings exactly as a container would, from only the given environment."""

    def load(env: dict[str, str]) -> Settings:
        for key in list(os.environ):
            if key.startswith("BRIDGE_") or key == "KAFKA_BOOTSTRAP_SERVERS":
                monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        return load_settings()

    yield load


def _deployment(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    (deployment,) = [
        d
        for d in _kind(docs, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return deployment


def _worker_packs(worker: dict[str, Any]) -> list[str]:
    args = _container(worker)["args"]
    assert args[0] == "workers"
    return [args[i + 1] for i, arg in enumerate(args) if arg == "--pack"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kafka_topics_are_the_layout_the_bridge_would_create(
    rendered: dict[str, list[dict[str, Any]]], overlay: str, settings_from: Any
) -> None:
    # The bridge runs with auto_create_topics false, so Strimzi must create exactly the topics
    # (names, partitions, replication, configs) that `bridge topics create` would.
    docs = rendered[overlay]
    server = _deployment(docs, "server")
    settings = settings_from(_env(docs, server))
    assert settings.auto_create_topics is False
    served = [t.job_topic or settings.topics.jobs(t.name) for t in tool_catalog(settings)]
    worked = [
        settings.topics.jobs(t.name) for t in pack_tools(_worker_packs(_deployment(docs, "worker")))
    ]
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
    assert topics["mcpbridge.task-index"]["config"]["cleanup.policy"] == "compact"
    for name, spec in topics.items():
        if name != "mcpbridge.task-index":
            assert "compact" not in str(spec["config"]["cleanup.policy"]), name


# --- workloads ---------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_is_hardened_and_sized(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    deployments = _kind(rendered[overlay], "Deployment")
    assert len(deployments) == 3
    for deployment in deployments:
        name = deployment["metadata"]["name"]
        pod = deployment["spec"]["template"]["spec"]
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
    for deployment in _kind(rendered["prod"], "Deployment"):
        image = _container(deployment)["image"]
        assert re.search(r":v?\d+\.\d+\.\d+$|@sha256:[0-9a-f]{64}$", image), image


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_server_probes_drains_and_spreads(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    server = _deployment(docs, "server")
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
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # preStop, then the 10 s graceful drain of streams, with time left to close Kafka clients.
    assert pod["terminationGracePeriodSeconds"] > int(pre_stop[1]) + 10
    assert pod.get("topologySpreadConstraints") or pod.get("affinity", {}).get("podAntiAffinity")
    assert server["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    hpa = _one(docs, "HorizontalPodAutoscaler", NAME)
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": NAME,
    }
    assert hpa["spec"]["minReplicas"] == server["spec"]["replicas"]
    expected = 1 if overlay == "dev" else 2
    assert server["spec"]["replicas"] >= expected


def test_prod_keeps_two_replicas_through_disruptions(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    pdb = _one(rendered["prod"], "PodDisruptionBudget", NAME)
    assert pdb["spec"] == {"minAvailable": 2, "selector": pdb["spec"]["selector"]}
    assert _deployment(rendered["prod"], "server")["spec"]["replicas"] > 2


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_exactly_one_index_writer_runs(
    rendered: dict[str, list[dict[str, Any]]], overlay: str, settings_from: Any
) -> None:
    docs = rendered[overlay]
    writer = _deployment(docs, "index-writer")
    assert _container(writer)["args"] == ["index"]  # ENTRYPOINT ["bridge"]: `bridge index`
    assert writer["spec"]["replicas"] == 1
    assert writer["spec"]["strategy"] == {"type": "Recreate"}
    # Neither the servers nor anything else persists the index.
    assert settings_from(_env(docs, _deployment(docs, "server"))).index_writer is False
    writers = [d for d in _kind(docs, "Deployment") if _container(d)["args"][0] == "index"]
    assert writers == [writer]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_role_loads_its_settings(
    rendered: dict[str, list[dict[str, Any]]], overlay: str, settings_from: Any
) -> None:
    docs = rendered[overlay]
    namespace = _deployment(docs, "server")["metadata"]["namespace"]
    for deployment in _kind(docs, "Deployment"):
        settings = settings_from(_env(docs, deployment))
        assert settings.kafka_bootstrap_servers == "my-cluster-kafka-bootstrap:9092"
        assert settings.auto_create_topics is False
    server = settings_from(_env(docs, _deployment(docs, "server")))
    assert server.http_host == "0.0.0.0" and server.http_port == 8080
    # DNS rebinding protection: the names clients use for the Service must be allowed.
    for host in (NAME, f"{NAME}.{namespace}.svc", f"{NAME}.{namespace}.svc.cluster.local"):
        assert host in server.allowed_hosts, host
    assert "*" not in server.allowed_hosts
    pack_tools(_worker_packs(_deployment(docs, "worker")))  # the packs exist


def test_prod_authenticates_with_a_secret_mounted_read_only(
    rendered: dict[str, list[dict[str, Any]]], settings_from: Any
) -> None:
    docs = rendered["prod"]
    server = _deployment(docs, "server")
    settings = settings_from(_env(docs, server))
    assert settings.auth.mode == "jwt"
    assert settings.auth.jwks_file is not None
    volumes = {v["name"]: v for v in server["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [
        m
        for m in _container(server)["volumeMounts"]
        if settings.auth.jwks_file.is_relative_to(m["mountPath"])
    ]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["secret"]["secretName"] == "mcp-kafka-bridge-auth"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_is_in_the_repository(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    assert not _kind(docs, "Secret")
    for key, value in _config_map(docs).items():
        assert not re.search(r"TOKEN|SECRET|PASSWORD", key), key
        assert not re.search(r"-----BEGIN|eyJ[\w-]{10,}\.", value), key


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
    for deployment in _kind(docs, "Deployment"):
        template = deployment["spec"]["template"]["metadata"]["labels"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert {"app.kubernetes.io/name", "app.kubernetes.io/component"} <= set(selector)
        assert _selects(selector, template)
        assert template["app.kubernetes.io/part-of"] == NAME
        pods[template["app.kubernetes.io/component"]] = template
    assert set(pods) == {"server", "index-writer", "worker"}

    def selected(selector: dict[str, str]) -> set[str]:
        return {component for component, labels in pods.items() if _selects(selector, labels)}

    service = _one(docs, "Service", NAME)
    assert selected(service["spec"]["selector"]) == {"server"}
    assert selected(_one(docs, "PodDisruptionBudget", NAME)["spec"]["selector"]["matchLabels"]) == {
        "server"
    }
    monitor = _one(docs, "ServiceMonitor", NAME)
    assert _selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {
        p["name"] for p in service["spec"]["ports"]
    }
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_allow_kafka_dns_and_the_mcp_port_only(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    policies = _kind(rendered[overlay], "NetworkPolicy")
    egress_peers = []
    ingress_ports = []
    for policy in policies:
        spec = policy["spec"]
        assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == NAME
        for rule in spec.get("egress", []):
            egress_peers += rule["to"]
            assert {p["port"] for p in rule["ports"]} <= {9092, 53}
        for rule in spec.get("ingress", []):
            ingress_ports += [p["port"] for p in rule["ports"]]
            assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "server"
    assert ingress_ports == ["http"]
    # Peers must keep their own labels: the kustomize `labels` must not have reached them.
    for peer in egress_peers:
        assert not any(
            k.startswith("app.kubernetes.io/") for k in peer["podSelector"]["matchLabels"]
        )
    kafka = [p for p in egress_peers if "strimzi.io/cluster" in p["podSelector"]["matchLabels"]]
    assert kafka and any("k8s-app" in p["podSelector"]["matchLabels"] for p in egress_peers)


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
