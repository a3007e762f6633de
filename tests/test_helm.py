"""The Helm chart (charts/mcp-kafka-bridge): linted, rendered and validated offline.

Every documented values file (the chart's values.yaml, i.e. the defaults, and each file of
charts/mcp-kafka-bridge/examples/) goes through ``helm lint --strict`` and ``helm template``,
and every rendered object through ``kubeconform -strict`` with the same schemas, versions and
exceptions as the kustomize overlays (tests/test_k8s.py: KafkaTopic checked against
KAFKA_TOPIC_SCHEMA instead). Then the behaviours that matter are asserted on what was rendered:
the replicas divide the partitions exactly when there are several, with each pod's own name as
its group member id and address; every pod is hardened; no Secret carries a literal value; the
optional CRD objects are absent unless asked for; the topics and KafkaUsers are what the bridge
itself would create and check (bridge.kafka.topics, bridge.kafka.acls); the dashboard and the
alert rules are the repository's own files, not copies; bad values are refused with a message.

helm comes from ``make k8s-tools`` (k8s/install-tools.sh, the Go module proxy) into
``$K8S_TOOLS_DIR``. Without it these tests skip, except under CI, where they fail.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest

# The kustomize tests' helpers and fixtures: the chart is held to the same checks.
from test_k8s import (
    KAFKA_TOPIC_SCHEMA,
    KUBERNETES_VERSIONS,
    SECRET_KEYS,
    TOOLS_DIR,
    _container,
    _docs,
    _env,
    _expected_acls,
    _failures,
    _kind,
    _kubeconform,
    _missing,
    _one,
    _secret_files,
    _selects,
    _strimzi_acls,
    kubeconform_path,
    settings_loader,
)

from bridge.kafka.topics import topic_layout
from bridge.keyring import parse_keyring
from bridge.log.identity import load_keyring
from bridge.sealing import KeyRing
from bridge.server.auth import unauthenticated_exposure
from bridge.server.events import webhook_sealer
from bridge.workers.packs import PACKS, pack_tools

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "mcp-kafka-bridge"
EXAMPLES = sorted(p.stem for p in (CHART / "examples").glob("*.yaml"))
#: "defaults" is values.yaml with only the values it requires (REQUIRED); the others add
#: examples/<name>.yaml (after the example it extends, EXTENDS).
VALUES = ("defaults", *EXAMPLES)
#: What values.yaml leaves to the operator, and the chart refuses to render without: the JWT
#: Secret, issuer and audience, and each role's Kafka (SCRAM) credentials.
REQUIRED = (
    "auth.existingSecret=mcp-kafka-bridge-auth",
    "auth.jwt.issuer=https://auth.example.com/",
    "auth.jwt.audience=mcp-kafka-bridge",
    "kafka.users.server.secret=mcp-kafka-bridge-server",
    "kafka.users.server.username=mcp-kafka-bridge-server",
    "kafka.users.worker.secret=mcp-kafka-bridge-worker",
    "kafka.users.worker.username=mcp-kafka-bridge-worker",
)
#: Examples that add to another's values (monitoring adds to an install's).
EXTENDS = {"monitoring": "scram"}
RELEASE = "mcp-kafka-bridge"
#: The Secrets the chart generates when no existing one is named.
PEER = f"{RELEASE}-peer"
IDENTITY = f"{RELEASE}-identity"
NAMESPACE = "mcp-bridge"
PEERS = f"{RELEASE}-peers"
#: The Kubernetes version helm renders for (a `go install`ed helm would assume 1.20, which the
#: chart's kubeVersion refuses); the schema test renders for each supported version.
KUBE = KUBERNETES_VERSIONS[-1]
#: Secrets the examples name but do not create (they are the operator's), with their keys.
EXAMPLE_SECRETS = {
    "mcp-kafka-bridge-peer": {"secret"},
    "mcp-kafka-bridge-identity": {"identity.keys"},
    "mcp-kafka-bridge-webhook-keys": {"keys.json"},
    "mcp-kafka-bridge-auth": {"jwks.json", "tokens.json"},
    "kafka-ca": {"ca.crt"},
    "mcp-bridge-server-cert": {"user.crt", "user.key"},
    "mcp-bridge-worker-cert": {"user.crt", "user.key"},
    # REQUIRED's SCRAM credentials, as the operator would make them.
    "mcp-kafka-bridge-server": {"password"},
    "mcp-kafka-bridge-worker": {"password"},
}


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = TOOLS_DIR / "bin" / "helm"
    if not os.access(path, os.X_OK):
        _missing(f"helm is not installed in {path.parent}")
    # helm keeps config, cache and data under these; a throwaway home keeps the runs hermetic.
    home = tmp_path_factory.mktemp("helm-home")
    for name in ("HELM_CONFIG_HOME", "HELM_CACHE_HOME", "HELM_DATA_HOME"):
        os.environ[name] = str(home / name.lower())
    return str(path)


@pytest.fixture(scope="session")
def kubeconform() -> str:
    return kubeconform_path()


@pytest.fixture
def settings_from(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """Settings loaded as a container of a rendered workload would (tests/test_k8s.py)."""
    return settings_loader(monkeypatch, tmp_path)


def _values_args(values: str) -> list[str]:
    if values == "defaults":
        return [arg for s in REQUIRED for arg in ("--set", s)]
    files = [EXTENDS[values], values] if values in EXTENDS else [values]
    return [arg for name in files for arg in ("-f", str(CHART / "examples" / f"{name}.yaml"))]


def _run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)


@functools.cache
def _template(helm: str, values: str, *sets: str, kube: str = KUBE) -> str:
    done = _run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        f"--kube-version={kube}",
        *_values_args(values),
        *(arg for s in sets for arg in ("--set", s)),
    )
    assert done.returncode == 0, f"helm template ({values}, {sets}) failed:\n{done.stderr}"
    return done.stdout


def _render(helm: str, values: str, *sets: str) -> list[dict[str, Any]]:
    return _docs(_template(helm, values, *sets))


def _workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return _kind(docs, "StatefulSet") + _kind(docs, "Deployment")


def _server(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (server,) = _kind(docs, "StatefulSet")
    return server


def _worker(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (worker,) = _kind(docs, "Deployment")
    return worker


@pytest.fixture
def example_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let test_k8s's Secret lookup know the keys of the Secrets the examples name."""
    for name, keys in EXAMPLE_SECRETS.items():
        monkeypatch.setitem(SECRET_KEYS, name, keys)


# --- lint, render, validate --------------------------------------------------------------------


def test_every_example_is_documented() -> None:
    assert {"minimal", "replicas", "scram", "mtls", "monitoring"} <= set(EXAMPLES)
    deployment = (ROOT / "docs" / "deployment.md").read_text()
    for name in EXAMPLES:
        assert f"examples/{name}.yaml" in deployment, name


@pytest.mark.parametrize("values", VALUES)
def test_helm_lint_passes_strictly(helm: str, values: str) -> None:
    done = _run_helm(
        helm,
        "lint",
        "--strict",
        f"--kube-version={KUBE}",
        str(CHART),
        "--namespace",
        NAMESPACE,
        *_values_args(values),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values", VALUES)
def test_every_rendered_object_is_valid_against_the_kubernetes_and_crd_schemas(
    helm: str, kubeconform: str, values: str, version: str
) -> None:
    text = _template(helm, values, kube=version)
    results = _kubeconform(kubeconform, text, version)
    assert not _failures(results)
    assert len(results) == len(_docs(text))
    skipped = {r["kind"] for r in results if r["status"] == "statusSkipped"}
    assert skipped <= {"KafkaTopic"}
    for topic in _kind(_docs(text), "KafkaTopic"):
        jsonschema.validate(topic, KAFKA_TOPIC_SCHEMA)
    valid = {r["kind"] for r in results if r["status"] == "statusValid"}
    assert {"StatefulSet", "Service", "ConfigMap", "NetworkPolicy", "ServiceAccount"} <= valid


def test_the_defaults_render_the_objects_of_the_kustomize_base(helm: str) -> None:
    docs = _render(helm, "defaults")
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Secret",
        "Service",
        "ServiceAccount",
        "StatefulSet",
    ]
    assert {s["metadata"]["name"] for s in _kind(docs, "Service")} == {RELEASE, PEERS}
    # base's four policies, but the egress to webhook callbacks only once webhooks are on.
    policies = {p["metadata"]["name"] for p in _kind(docs, "NetworkPolicy")}
    assert len(policies) == 3 and f"{RELEASE}-webhooks" not in policies
    on = _render(helm, "defaults", "webhooks.existingSecret=mcp-kafka-bridge-webhook-keys")
    assert policies | {f"{RELEASE}-webhooks"} == {
        p["metadata"]["name"] for p in _kind(on, "NetworkPolicy")
    }
    assert _one(docs, "ServiceAccount", RELEASE)["automountServiceAccountToken"] is False


# --- replicas ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("replicas", "divides"), [(1, False), (2, True), (6, True)])
def test_more_than_one_replica_divides_the_partitions_by_pod_name(
    helm: str, replicas: int, divides: bool, example_secrets: None
) -> None:
    docs = _render(helm, "defaults", f"server.replicas={replicas}")
    server = _server(docs)
    assert server["spec"]["replicas"] == replicas
    assert server["spec"]["serviceName"] == PEERS
    assert server["spec"]["podManagementPolicy"] == "Parallel"
    env = _env(docs, server)
    if not divides:
        # One replica owns every partition: no group settings, no peer secret at all.
        assert env.get("BRIDGE_REPLICAS__OWNERSHIP", "all") == "all"
        assert "BRIDGE_PEERS__SECRET_FILE" not in env and "BRIDGE_REPLICAS__INSTANCE_ID" not in env
        # The only Secret: the task identity keyring (a lone replica needs one too).
        assert [s["metadata"]["name"] for s in _kind(docs, "Secret")] == [IDENTITY]
        assert not [path for path in _secret_files(docs, server) if "/peer/" in path]
        return
    assert env["BRIDGE_REPLICAS__OWNERSHIP"] == "group"
    peers = _one(docs, "Service", PEERS)
    (port,) = peers["spec"]["ports"]
    assert peers["spec"]["clusterIP"] == "None"
    assert _selects(peers["spec"]["selector"], server["spec"]["template"]["metadata"]["labels"])
    urls = set()
    for ordinal in range(replicas):
        env = _env(docs, server, ordinal)
        pod = f"{RELEASE}-{ordinal}"
        assert env["BRIDGE_REPLICAS__INSTANCE_ID"] == pod
        url = env["BRIDGE_PEERS__ADVERTISED_URL"]
        assert url == f"http://{pod}.{PEERS}.{NAMESPACE}.svc.cluster.local:{port['port']}"
        assert port["port"] == int(env["BRIDGE_PEERS__PORT"]) == 8081  # the peer listener
        urls.add(url)
    assert len(urls) == replicas
    ports = {p["name"]: p["containerPort"] for p in _container(server)["ports"]}
    assert port["targetPort"] == "peer" and ports == {"http": 8080, "peer": 8081}
    # Only server pods reach the peer port, and no other policy opens it.
    server_pods = server["spec"]["template"]["metadata"]["labels"]
    for policy in _kind(docs, "NetworkPolicy"):
        for rule in policy["spec"].get("ingress", []):
            if "peer" in {p["port"] for p in rule["ports"]}:
                assert policy["metadata"]["name"] == f"{RELEASE}-peers"
                (source,) = rule["from"]
                assert _selects(source["podSelector"]["matchLabels"], server_pods)
                assert not _selects(
                    source["podSelector"]["matchLabels"],
                    _worker(docs)["spec"]["template"]["metadata"]["labels"],
                )
        for rule in policy["spec"].get("egress", []):
            if any(
                "podSelector" in to and _selects(to["podSelector"]["matchLabels"], server_pods)
                for to in rule["to"]
            ):
                assert {p["port"] for p in rule["ports"]} == {8081}
    secret_file = env["BRIDGE_PEERS__SECRET_FILE"]
    assert _secret_files(docs, server)[secret_file] == f"{RELEASE}-peer/secret"
    # Only the server divides partitions.
    assert "BRIDGE_REPLICAS__OWNERSHIP" not in _env(docs, _worker(docs))


def test_autoscaling_leaves_the_count_to_the_autoscaler_and_divides(helm: str) -> None:
    docs = _render(helm, "replicas")
    server = _server(docs)
    assert "replicas" not in server["spec"]  # an upgrade must not reset the HPA's choice
    hpa = _one(docs, "HorizontalPodAutoscaler", RELEASE)
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    partitions = int(_one(docs, "ConfigMap", RELEASE)["data"]["BRIDGE_TOPICS__PARTITIONS"])
    assert 1 < hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"] <= partitions
    assert {m["type"] for m in hpa["spec"]["metrics"]} == {"Resource", "Pods"}
    assert _env(docs, server)["BRIDGE_REPLICAS__OWNERSHIP"] == "group"
    # The operator's peer Secret: the chart renders none.
    assert not _kind(docs, "Secret")
    assert _one(docs, "PodDisruptionBudget", RELEASE)["spec"]["minAvailable"] == 2


# --- secrets -----------------------------------------------------------------------------------


def test_the_generated_peer_secret_is_random_never_a_literal_default(helm: str) -> None:
    # helm template cannot look up a live Secret, so each render generates anew: two renders
    # differing is what shows the value is not written in the chart.
    values = []
    for _ in range(2):
        rendered = _template.__wrapped__(helm, "defaults")  # not the cached render: a new one
        (secret,) = [s for s in _kind(_docs(rendered), "Secret") if s["metadata"]["name"] == PEER]
        value = base64.b64decode(secret["data"]["secret"]).decode()
        assert len(value) >= 32 and value.isalnum()
        values.append(value)
    assert values[0] != values[1]


@pytest.mark.parametrize("values", VALUES)
def test_no_secret_value_is_in_the_chart_or_its_examples(helm: str, values: str) -> None:
    docs = _render(helm, values)
    for secret in _kind(docs, "Secret"):
        # Only the generated peer secret and identity keyring, when the chart is asked to make
        # them (their randomness is checked above and below).
        assert {PEER: {"secret"}, IDENTITY: {"identity.keys"}}[secret["metadata"]["name"]] == set(
            secret["data"]
        )
    for config_map in _kind(docs, "ConfigMap"):
        for key, value in config_map["data"].items():
            if any(word in key for word in ("TOKEN", "SECRET", "PASSWORD")):
                assert key.endswith("_FILE") and value.startswith("/etc/mcp-kafka-bridge/")
    for workload in _workloads(docs):
        for entry in _container(workload).get("env", []):
            if any(word in entry["name"] for word in ("TOKEN", "SECRET", "PASSWORD")):
                assert "value" not in entry or entry["name"].endswith("_FILE"), entry


@pytest.mark.parametrize("values", VALUES)
def test_every_pod_is_hardened(helm: str, values: str) -> None:
    workloads = _workloads(_render(helm, values))
    assert workloads
    for workload in workloads:
        name = workload["metadata"]["name"]
        pod = workload["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] != 0, name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert not pod.get("hostNetwork") and not pod.get("hostPID"), name
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes["tmp"], name
        for container in pod["containers"] + pod.get("initContainers", []):
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True, name
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["privileged"] is False, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name
            assert context["seccompProfile"]["type"] == "RuntimeDefault", name
            assert {"mountPath": "/tmp", "name": "tmp"} in container["volumeMounts"], name
            for bound in ("requests", "limits"):
                assert set(container["resources"][bound]) >= {"cpu", "memory"}, name
            assert not container["image"].endswith(":latest"), name
            for mount in container["volumeMounts"]:
                secret = volumes[mount["name"]].get("secret")
                if secret is not None:
                    assert mount["readOnly"] is True, mount
                    assert secret["defaultMode"] & 0o007 == 0, secret


@pytest.mark.parametrize("values", VALUES)
def test_every_role_loads_its_settings(
    helm: str, values: str, settings_from: Any, example_secrets: None
) -> None:
    # Loading fails when a *_FILE setting names a file no mounted Secret key provides.
    docs = _render(helm, values)
    for workload in _workloads(docs):
        settings = settings_from(docs, workload)
        assert settings.topics.auto_create is not bool(_kind(docs, "KafkaTopic"))
    server = settings_from(docs, _server(docs))
    for host in (RELEASE, f"{RELEASE}.{NAMESPACE}.svc", f"{RELEASE}.{NAMESPACE}.svc.cluster.local"):
        assert host in server.server.allowed_hosts


# --- Kafka security, topics, users -------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "protocol", "files"),
    [
        ("defaults", "SASL_SSL", {"password", "ca.crt"}),
        ("minimal", "PLAINTEXT", set()),
        ("scram", "SASL_SSL", {"password", "ca.crt"}),
        ("mtls", "SSL", {"user.crt", "user.key", "ca.crt"}),
    ],
)
def test_kafka_security_mounts_only_the_role_s_own_credentials(
    helm: str,
    values: str,
    protocol: str,
    files: set[str],
    settings_from: Any,
    example_secrets: None,
) -> None:
    docs = _render(helm, values)
    for workload in _workloads(docs):
        settings = settings_from(docs, workload)
        role = workload["metadata"]["labels"]["app.kubernetes.io/component"]
        assert settings.kafka.security_protocol == protocol
        kafka = {
            path.rsplit("/", 1)[1]: source
            for path, source in _secret_files(docs, workload).items()
            if "/kafka-" in path
        }
        assert set(kafka) == files, role
        user_sources = {s.split("/")[0] for f, s in kafka.items() if f != "ca.crt"}
        assert len(user_sources) <= 1 and all(role in s for s in user_sources), user_sources
        if protocol == "SASL_SSL":
            assert settings.kafka.sasl.username == f"{RELEASE}-{role}"
            assert settings.kafka.sasl.mechanism == "SCRAM-SHA-512"
    policy = _one(docs, "NetworkPolicy", RELEASE)
    port = int(
        _one(docs, "ConfigMap", RELEASE)["data"]["BRIDGE_KAFKA__BOOTSTRAP_SERVERS"].rsplit(":", 1)[
            1
        ]
    )
    assert policy["spec"]["egress"][0]["ports"] == [{"port": port, "protocol": "TCP"}]


def test_the_chart_knows_the_tools_of_every_pack(helm: str) -> None:
    # _helpers.tpl lists each built-in pack's tools (for job topics and ACLs): compare.
    packs = ",".join(sorted(PACKS))
    docs = _render(
        helm,
        "defaults",
        "topics.create=true",
        f"bridge.toolPacks={{{packs}}}",
        "workers.enabled=false",
    )
    topics = {t["spec"]["topicName"] for t in _kind(docs, "KafkaTopic")}
    jobs = {t for t in topics if ".jobs." in t}
    assert jobs == {f"mcpbridge.jobs.{t.name}" for t in pack_tools(sorted(PACKS))}


@pytest.mark.parametrize("values", ["scram", "replicas"])
def test_kafka_topics_are_the_layout_the_bridge_would_create(
    helm: str, values: str, settings_from: Any, example_secrets: None
) -> None:
    docs = _render(helm, values, "bridge.toolPacks={demo,conformance}")
    settings = settings_from(docs, _server(docs))
    assert settings.topics.auto_create is False
    job_topics = [settings.topics.jobs(t.name) for t in pack_tools(["demo", "conformance"])]
    layout = topic_layout(settings, job_topics)
    topics = {t["spec"]["topicName"]: t for t in _kind(docs, "KafkaTopic")}
    assert sorted(topics) == sorted(spec.name for spec in layout)
    for spec in layout:
        topic = topics[spec.name]
        assert topic["metadata"]["labels"]["strimzi.io/cluster"] == "my-cluster"
        assert topic["spec"]["partitions"] == spec.partitions, spec.name
        assert topic["spec"]["replicas"] == spec.replication_factor, spec.name
        assert {k: str(v) for k, v in topic["spec"]["config"].items()} == spec.configs, spec.name


def test_kafka_users_carry_exactly_the_acls_of_their_role(
    helm: str, settings_from: Any, example_secrets: None
) -> None:
    docs = _render(helm, "scram")
    users = {
        u["metadata"]["labels"]["app.kubernetes.io/component"]: u for u in _kind(docs, "KafkaUser")
    }
    assert set(users) == {"server", "worker", "pipeline"}
    server_settings = settings_from(docs, _server(docs))
    server_jobs = [
        server_settings.topics.jobs(t.name) for t in pack_tools(server_settings.tool_packs)
    ]
    worker_packs = [a for a in _container(_worker(docs))["args"][1:] if a != "--pack"]
    worker_jobs = [server_settings.topics.jobs(t.name) for t in pack_tools(worker_packs)]
    jobs = {"server": server_jobs, "worker": worker_jobs, "pipeline": []}
    for role, user in users.items():
        assert user["metadata"]["name"] == f"{RELEASE}-{role}"
        assert user["spec"]["authentication"] == {"type": "scram-sha-512"}
        granted = _strimzi_acls(user)
        assert len(granted) == len(set(granted)), role
        expected = _expected_acls(role, server_settings, jobs[role])  # type: ignore[arg-type]
        assert sorted(granted) == sorted(expected), role


# --- monitoring --------------------------------------------------------------------------------

MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}


@pytest.mark.parametrize("values", [v for v in VALUES if v != "monitoring"])
def test_monitoring_objects_are_absent_unless_asked_for(helm: str, values: str) -> None:
    docs = _render(helm, values)
    assert not {d["kind"] for d in docs} & MONITORING_KINDS
    assert not [
        c for c in _kind(docs, "ConfigMap") if "grafana_dashboard" in c["metadata"]["labels"]
    ]


def test_the_dashboard_configmap_is_grafana_s_file_for_the_sidecar(helm: str) -> None:
    docs = _render(helm, "monitoring")
    (dashboard,) = [
        c for c in _kind(docs, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")
    ]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"]["grafana_folder"] == "MCP Kafka Bridge"
    source = (ROOT / "grafana" / "dashboards" / "mcp-kafka-bridge.json").read_text()
    assert dashboard["data"]["mcp-kafka-bridge.json"] == source  # byte for byte
    json.loads(dashboard["data"]["mcp-kafka-bridge.json"])
    # The label is configurable for sidecars that watch another.
    other = _render(helm, "monitoring", "monitoring.dashboard.label=my_dashboards")
    (dashboard,) = [
        c for c in _kind(other, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")
    ]
    assert dashboard["metadata"]["labels"]["my_dashboards"] == "1"


def test_the_prometheus_rule_is_the_kustomize_base_s(helm: str) -> None:
    docs = _render(helm, "monitoring")
    rule = _one(docs, "PrometheusRule", RELEASE)
    (base,) = _docs((ROOT / "k8s" / "base" / "prometheusrule.yaml").read_text())
    assert rule["spec"] == base["spec"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    monitor = _one(docs, "ServiceMonitor", RELEASE)
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # Scraped once per pod: through the client Service only, not the peers Service.
    scraped = [
        s["metadata"]["name"]
        for s in _kind(docs, "Service")
        if _selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
        and monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in s["spec"]["ports"]}
    ]
    assert scraped == [RELEASE]


def test_the_dashboard_and_rules_have_one_source_each() -> None:
    # Links, not copies: Helm follows them when it loads the chart (helm package stores the
    # content), so there is nothing to regenerate and nothing to drift.
    for link, source in {
        "dashboard.json": ROOT / "grafana" / "dashboards" / "mcp-kafka-bridge.json",
        "prometheusrule.yaml": ROOT / "k8s" / "base" / "prometheusrule.yaml",
    }.items():
        path = CHART / "files" / link
        assert path.is_symlink(), path
        assert path.resolve() == source.resolve()


# --- bad values --------------------------------------------------------------------------------


# --- the keys kept outside Kafka --------------------------------------------------------------


@functools.cache
def _notes(helm: str, tmp: Path, values: str, *sets: str) -> str:
    """NOTES.txt as `helm install` would print it: helm template skips it, so a copy of the chart
    renders it as a ConfigMap (its text unchanged, inside a define)."""
    chart = tmp / f"chart-{abs(hash((values, sets)))}"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_notes.tpl").write_text(
        f'{{{{- define "notes" -}}}}{notes}{{{{- end -}}}}'
    )
    (chart / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ include "notes" . | quote }}}\n'
    )
    done = _run_helm(
        helm,
        "template",
        RELEASE,
        str(chart),
        f"--kube-version={KUBE}",
        "--show-only=templates/notes.yaml",
        *_values_args(values),
        *(arg for s in sets for arg in ("--set", s)),
    )
    assert done.returncode == 0, done.stderr
    return str(_docs(done.stdout)[0]["data"]["notes"])


@pytest.fixture(scope="module")
def notes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("notes")


@pytest.mark.parametrize(
    ("values", "sets"),
    [*((v, ()) for v in VALUES), ("defaults", ("server.replicas=1",))],
)
def test_every_server_signs_task_identities_with_a_keyring_from_a_secret(
    helm: str, values: str, sets: tuple[str, ...], settings_from: Any, example_secrets: None
) -> None:
    # Never the key a lone process would make on its pod's disk (lost with the pod), nor one
    # derived from the peer secret: a keyring mounted read-only from a Secret, on every replica.
    docs = _render(helm, values, *sets)
    server = _server(docs)
    keys_file = _env(docs, server)["BRIDGE_IDENTITY__KEYS_FILE"]
    # The generated Secret, or the operator's of the same name (examples/replicas.yaml).
    assert _secret_files(docs, server)[keys_file] == f"{IDENTITY}/identity.keys"
    assert load_keyring(settings_from(docs, server)).current == "staged"
    # A worker (a pipeline) never holds it: holding it is the task-creator credential.
    assert not any("IDENTITY" in name for name in _env(docs, _worker(docs)))


def test_the_generated_identity_keyring_is_random_kept_and_usable(helm: str) -> None:
    keyrings = []
    for _ in range(2):
        docs = _docs(_template.__wrapped__(helm, "defaults", "server.replicas=1"))
        (secret,) = [s for s in _kind(docs, "Secret") if s["metadata"]["name"] == IDENTITY]
        # Left in place by `helm uninstall`, like the topics whose tasks it signed.
        assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        text = base64.b64decode(secret["data"]["identity.keys"]).decode()
        assert parse_keyring(text).current == "k1"
        keyrings.append(text)
    assert keyrings[0] != keyrings[1]  # made at random, never written in the chart
    template = (CHART / "templates" / "identity-secret.yaml").read_text()
    assert "lookup" in template  # an upgrade keeps the live Secret's keyring


def test_an_existing_identity_secret_is_mounted_and_none_generated(helm: str) -> None:
    docs = _render(helm, "defaults", "identity.existingSecret=my-keys", "identity.key=ring")
    server = _server(docs)
    keys_file = _env(docs, server)["BRIDGE_IDENTITY__KEYS_FILE"]
    volumes = {v["name"]: v for v in server["spec"]["template"]["spec"]["volumes"]}
    assert volumes["identity-keys"]["secret"]["secretName"] == "my-keys"
    assert volumes["identity-keys"]["secret"]["items"] == [{"key": "ring", "path": "identity.keys"}]
    assert keys_file == "/etc/mcp-kafka-bridge/identity/identity.keys"
    assert IDENTITY not in {s["metadata"]["name"] for s in _kind(docs, "Secret")}


def test_webhooks_are_off_without_a_key_secret_and_the_notes_say_so(
    helm: str, notes_dir: Path, settings_from: Any, example_secrets: None
) -> None:
    docs = _render(helm, "defaults")
    server = _server(docs)
    assert "BRIDGE_WEBHOOKS__KEYS__FILE" not in _env(docs, server)
    assert webhook_sealer(settings_from(docs, server)) is None
    notes = _notes(helm, notes_dir, "defaults")
    assert "WARNING: webhook delivery is OFF" in notes and "webhooks.existingSecret" in notes
    assert f"Task identity keyring: Secret {IDENTITY} (generated" in notes


def test_a_webhook_key_secret_turns_webhooks_on_mounted_read_only(
    helm: str, notes_dir: Path, settings_from: Any, example_secrets: None
) -> None:
    sets = ("webhooks.existingSecret=mcp-kafka-bridge-webhook-keys",)
    docs = _render(helm, "defaults", *sets)
    server = _server(docs)
    keys_file = _env(docs, server)["BRIDGE_WEBHOOKS__KEYS__FILE"]
    assert _secret_files(docs, server)[keys_file] == "mcp-kafka-bridge-webhook-keys/keys.json"
    mounts = {m["mountPath"]: m for m in _container(server)["volumeMounts"]}
    assert mounts[keys_file.rsplit("/", 1)[0]]["readOnly"] is True
    settings = settings_from(docs, server)
    assert settings.webhooks.keys.file is not None and not settings.webhooks.keys.create
    assert KeyRing.load(settings.webhooks.keys.file).current == "staged"
    assert webhook_sealer(settings) is not None
    notes = _notes(helm, notes_dir, "defaults", *sets)
    assert "Webhook delivery is on" in notes and "OFF" not in notes
    # In auth mode none webhooks stay off whatever the key: the notes say that too.
    unauthenticated = _notes(helm, notes_dir, "minimal", *sets)
    assert "webhook delivery is OFF despite webhooks.existingSecret" in unauthenticated


def test_the_events_profile_is_set_only_when_it_is_not_the_default(
    helm: str, settings_from: Any, example_secrets: None
) -> None:
    keyed = "webhooks.existingSecret=mcp-kafka-bridge-webhook-keys"
    for sets, expected in (((), "sep-3415"), (("webhooks.profile=chatgpt", keyed), "chatgpt")):
        docs = _render(helm, "defaults", *sets)
        server = _server(docs)
        assert ("BRIDGE_EVENTS__PROFILE" in _env(docs, server)) is bool(sets)
        assert settings_from(docs, server).events.profile == expected


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["server.replicas=7"], "exceeds topics.partitions"),
        (["server.groupSessionTimeoutMs=1800000"], "groupSessionTimeoutMs must be 6000..300000"),
        (["server.groupSessionTimeoutMs=3000"], "groupSessionTimeoutMs must be 6000..300000"),
        (["autoscaling.enabled=true", "autoscaling.maxReplicas=12"], "exceeds topics.partitions"),
        (["auth.existingSecret="], "auth.existingSecret: the Secret holding jwks.json"),
        (["auth.mode=bearer", "auth.existingSecret="], "the Secret holding tokens.json"),
        (["auth.jwt.issuer="], "auth.jwt.issuer: the iss"),
        (["auth.jwt.audience="], "auth.jwt.audience: the aud"),
        (["auth.jwt.algorithms={HS256}"], "auth.jwt.hs256SecretKey"),
        (["auth.mode=none"], "auth.allowUnauthenticated=true, to confirm auth.mode=none"),
        (["auth.mode=password"], "auth.mode must be none, bearer or jwt"),
        (["kafka.users.worker.username="], "kafka.users.worker.username: its SCRAM user"),
        (["kafka.users.server.secret="], "kafka.users.server.secret: the Secret"),
        (["kafka.security=sasl"], "kafka.security must be none, scram or mtls"),
        (["strimzi.kafkaUsers=true", "kafka.security=mtls"], "topics.create=true"),
        (["bridge.extraSettings.BRIDGE_PEERS__SECRET=abc"], "would put a secret in a ConfigMap"),
        (["bridge.toolPacks={nosuchpack}"], 'unknown tool pack "nosuchpack"'),
        (["image.tag=latest"], "not latest"),
        (["bridge.allowedHosts={*}"], "DNS-rebinding"),
        (["kafka.bootstrapServers=broker"], "has no :port"),
        (["identity.key="], "identity.key: name the key of Secret mcp-kafka-bridge-identity"),
        (["webhooks.profile=openai"], 'webhooks.profile must be sep-3415 or chatgpt, not "openai"'),
        (["webhooks.profile=chatgpt"], "webhooks.profile=chatgpt needs webhooks.existingSecret"),
        (
            [
                "webhooks.profile=chatgpt",
                "webhooks.existingSecret=wh",
                "auth.mode=none",
                "auth.allowUnauthenticated=true",
            ],
            "webhooks.profile=chatgpt needs auth.mode bearer or jwt",
        ),
        (
            ["webhooks.existingSecret=wh", "webhooks.key="],
            "webhooks.key: name the key of Secret wh",
        ),
    ],
)
def test_bad_values_are_refused_with_a_clear_message(
    helm: str, sets: list[str], message: str
) -> None:
    # Everything else as required, so that each case fails on its own value.
    done = _run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        f"--kube-version={KUBE}",
        *(arg for s in (*REQUIRED, *sets) for arg in ("--set", s)),
    )
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


# --- secure defaults ---------------------------------------------------------------------------


def test_the_defaults_refuse_to_render_naming_every_value_to_set(helm: str) -> None:
    # `helm install` with values.yaml alone: one message with everything the operator decides.
    done = _run_helm(helm, "template", RELEASE, str(CHART), f"--kube-version={KUBE}")
    assert done.returncode != 0
    for value in [s.split("=")[0] for s in REQUIRED]:
        assert f"  - {value}: " in done.stderr, value
    # The insecure choices are named as what they are, never taken silently.
    assert "auth.mode=none with auth.allowUnauthenticated=true" in done.stderr
    assert "kafka.security=none" in done.stderr


def test_the_defaults_authenticate_callers_and_reach_kafka_over_sasl_ssl(
    helm: str, settings_from: Any, example_secrets: None
) -> None:
    docs = _render(helm, "defaults")
    server = settings_from(docs, _server(docs))
    assert server.auth.mode == "jwt"
    assert (server.auth.jwt_issuer, server.auth.jwt_audience) == (
        "https://auth.example.com/",
        "mcp-kafka-bridge",
    )
    for workload in _workloads(docs):
        settings = settings_from(docs, workload)
        assert settings.kafka.security_protocol == "SASL_SSL"
        assert settings.kafka.tls.ca_file is not None and settings.kafka.tls.check_hostname


@pytest.mark.parametrize("values", VALUES)
def test_every_server_passes_the_bridge_s_own_start_checks(
    helm: str, values: str, settings_from: Any, example_secrets: None
) -> None:
    # The pod listens on 0.0.0.0: mode none only with the opt-in, which the chart passes on.
    docs = _render(helm, values)
    settings = settings_from(docs, _server(docs))
    assert settings.server.host == "0.0.0.0"
    assert unauthenticated_exposure(settings) is None
    allowed = _env(docs, _server(docs)).get("BRIDGE_AUTH__ALLOW_UNAUTHENTICATED")
    assert (allowed == "true") is (settings.auth.mode == "none")


def test_an_extra_setting_under_its_0_2_0_name_is_written_under_its_grouped_name(
    helm: str, notes_dir: Path, settings_from: Any, example_secrets: None
) -> None:
    # The chart's own keys are grouped; a user's extraSettings may still say what 0.2.0 said.
    keepalive = "BRIDGE_STREAM_KEEPALIVE_S"  # 0.2.0's name
    check_hostname = "BRIDGE_KAFKA_TLS__CHECK_HOSTNAME"  # 0.2.0's name, under a moved group
    sets = (
        f"bridge.extraSettings.{keepalive}=20",
        f"bridge.extraSettings.{check_hostname}=false",
        "bridge.extraSettings.BRIDGE_CANARY__INTERVAL_S=10",
    )
    docs = _render(helm, "defaults", *sets)
    data = _one(docs, "ConfigMap", RELEASE)["data"]
    assert data["BRIDGE_STREAMS__KEEPALIVE_S"] == "20"
    assert data["BRIDGE_KAFKA__TLS__CHECK_HOSTNAME"] == "false"
    assert data["BRIDGE_CANARY__INTERVAL_S"] == "10"
    assert not {keepalive, check_hostname} & set(data)
    settings = settings_from(docs, _server(docs))
    assert settings.streams.keepalive_s == 20 and settings.kafka.tls.check_hostname is False
    notes = _notes(helm, notes_dir, "defaults", *sets)
    assert f"{keepalive} is now BRIDGE_STREAMS__KEEPALIVE_S" in notes
    assert f"{check_hostname} is now BRIDGE_KAFKA__TLS__CHECK_HOSTNAME" in notes
    assert "BRIDGE_CANARY__INTERVAL_S is now" not in notes
