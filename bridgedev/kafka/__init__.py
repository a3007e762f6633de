"""Development Kafka: where the CLI, the demo, the tests and the benches get a broker from.

Not part of the runtime: the server, log, tasks and workers packages never start brokers and
never import this package (only :mod:`bridge.cli` and :mod:`bridgedev.demo` do), and it uses no
Kafka client library (its one probe is a raw-socket ApiVersions request).

Along the way a broker is found or made:

- :mod:`~bridgedev.kafka.provider` chooses: the configured cluster, else Docker, else local jars;
- :mod:`~bridge.kafka.probe` asks whether an address answers as Kafka;
- :mod:`~bridgedev.kafka.docker` runs Kafka in a testcontainers container;
- :mod:`~bridgedev.kafka.jars` fetches the Kafka jars with Maven and checks the Java;
- :mod:`~bridgedev.kafka.kraft` writes a single-node KRaft broker's files and formats its storage;
- :mod:`~bridgedev.kafka.security` secures one: SASL_SSL, a CA made with trustme, SCRAM,
  PLAIN and OAUTHBEARER users, and the StandardAuthorizer with no ACL meaning no access;
- :mod:`~bridgedev.kafka.local` runs a throwaway broker owned by this process
  (:func:`start_local`, or :func:`start_secure` for a secured one);
- :mod:`~bridgedev.kafka.cluster` runs a throwaway three-broker cluster (:func:`start_cluster`,
  replication factor 3, min.insync.replicas 2) for the fault tests and the soak, its clients
  optionally through the TCP fault proxy of :mod:`~bridgedev.kafka.proxy` (cut, slow, restore);
- :mod:`~bridgedev.kafka.detached` runs the long-lived broker of ``bridge kafka start|stop``
  (``--secure`` also writes a client settings file);
- :mod:`~bridgedev.kafka.process` and :mod:`~bridgedev.kafka.files` hold the process, lock and
  file plumbing under them; :mod:`~bridgedev.kafka.broker` the handle types they all return.
"""

from bridge.kafka.probe import check_bootstrap
from bridgedev.kafka.broker import Broker, BrokerInfo, KafkaProviderError, SecureBrokerInfo
from bridgedev.kafka.cluster import ClusterNode, LocalCluster, start_cluster
from bridgedev.kafka.detached import local_status, start_local_detached, stop_local_detached
from bridgedev.kafka.docker import DOCKER_IMAGE, DockerBroker, DockerProbe, detect_docker
from bridgedev.kafka.jars import ensure_kafka_jars
from bridgedev.kafka.local import LocalBroker, SecureBroker, start_local, start_secure
from bridgedev.kafka.provider import ExternalBroker, provide_broker
from bridgedev.kafka.proxy import FaultProxy, Route

__all__ = [
    "DOCKER_IMAGE",
    "Broker",
    "BrokerInfo",
    "ClusterNode",
    "DockerBroker",
    "DockerProbe",
    "ExternalBroker",
    "FaultProxy",
    "KafkaProviderError",
    "LocalBroker",
    "LocalCluster",
    "Route",
    "SecureBroker",
    "SecureBrokerInfo",
    "check_bootstrap",
    "detect_docker",
    "ensure_kafka_jars",
    "local_status",
    "provide_broker",
    "start_cluster",
    "start_local",
    "start_local_detached",
    "start_secure",
    "stop_local_detached",
]
