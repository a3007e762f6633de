"""The throwaway three-broker cluster of the fault tests and the soak: combined KRaft nodes on
loopback, replication factor 3 and min.insync.replicas 2, with an optional fault proxy in front
of the clients' listeners.

:func:`start_cluster` formats every node's storage under one cluster id and starts the JVMs
together; it returns once each node answers ApiVersions. Whether the cluster also serves
(creates an RF-3 topic, elects leaders) needs a Kafka client, which this package does not use:
the caller checks that. Each node has three listeners: clients (``PLAINTEXT``), the other
brokers (``BROKER``) and the controller quorum (``CONTROLLER``). With ``proxied=True`` the
client listener is advertised at a :class:`~bridgedev.kafka.proxy.FaultProxy` port, so cutting
the proxy isolates the clients from every broker without partitioning the cluster.

Same life cycle as :func:`~bridgedev.kafka.local.start_local`: one temporary directory (a
sub-directory per node), removed on :meth:`LocalCluster.stop` or interpreter exit; a later
start sweeps what a killed owner left, every node's JVM included. The single broker stays the
default everywhere else; nothing here changes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bridge.config import Settings
from bridgedev.kafka.broker import (
    Broker,
    BrokerInfo,
    KafkaProviderError,
    Progress,
    _stderr_progress,
)
from bridgedev.kafka.files import _file_size, _write_atomic
from bridgedev.kafka.kraft import (
    _cluster_id,
    _format_storage,
    _free_ports,
    _listener_config,
    _node_config,
    _replication_config,
    _wait_ready,
    _write_node_files,
)
from bridgedev.kafka.local import _LIVE_BROKERS, _java_and_jars, _spawn_child, _temp_root
from bridgedev.kafka.process import _pid_alive, _process_state, _terminate_group
from bridgedev.kafka.proxy import FaultProxy

__all__ = ["ClusterNode", "LocalCluster", "start_cluster"]

#: Heap of each node's JVM: three of them share the machine.
CLUSTER_HEAP = "448m"
#: Replication of every topic the cluster creates by default, Kafka's internal ones included.
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 2


#: Bound of the wait until a signalled JVM shows the state the signal asked for.
_SIGNAL_BOUND_S = 10.0


class ClusterNode:
    """One combined broker and controller of a :class:`LocalCluster`.

    Its ports and storage outlive its process: :meth:`start` after :meth:`kill` brings the
    same node back with its data. Signals go to the JVM's process group.
    """

    def __init__(
        self, node_id: int, root: Path, port: int, java: str, libs: Path, heap: str
    ) -> None:
        self.node_id = node_id
        self.root = root
        #: The client listener's real port (the proxy, if any, forwards to it).
        self.port = port
        self._java = java
        self._libs = libs
        self._heap = heap
        self.process: subprocess.Popen[bytes] | None = None
        #: Called after each spawn (the cluster records the new pid for the orphan sweep).
        self.on_spawn: Callable[[], None] = lambda: None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The JVM's pid, None when it is not running."""
        process = self.process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    def spawn(self) -> int:
        """Start the JVM without waiting; returns where this run's output starts in the log."""
        with self._lock:
            if self.pid is not None:
                raise KafkaProviderError(f"Kafka node {self.node_id} already runs (pid {self.pid})")
            offset = _file_size(self.log_path)
            self.process = _spawn_child(self._java, self._libs, self.root, self._heap)
        self.on_spawn()
        return offset

    def wait_ready(self, timeout_s: float, log_offset: int = 0) -> None:
        """Wait until the node answers ApiVersions on its client port."""
        process = self.process
        if process is None:
            raise KafkaProviderError(f"Kafka node {self.node_id} was never started")
        _wait_ready(process.pid, self.root, self.port, timeout_s, log_offset)

    def start(self, timeout_s: float = 120.0) -> None:
        """Start the node again (same storage, same ports) and wait until it answers."""
        self.wait_ready(timeout_s, self.spawn())

    def kill(self) -> None:
        """SIGKILL: the node dies at once, as on a power cut (its storage stays)."""
        process = self.process
        if process is not None:
            _terminate_group(process.pid, 0.0, process)

    def freeze(self) -> None:
        """SIGSTOP: the node stops answering without closing a socket (a hung JVM, a long GC).

        Returns once the kernel shows the JVM stopped: a signal is delivered asynchronously.
        """
        self._signal(signal.SIGSTOP)
        pid = self.pid
        deadline = time.monotonic() + _SIGNAL_BOUND_S
        while pid is not None and _pid_alive(pid) and _process_state(pid) != "T":
            if time.monotonic() > deadline:
                raise KafkaProviderError(f"Kafka node {self.node_id} (pid {pid}) did not stop")
            time.sleep(0.01)

    def thaw(self) -> None:
        """SIGCONT: a frozen node runs on from where it stopped."""
        self._signal(signal.SIGCONT)

    def stop(self, grace_s: float = 0.0) -> None:
        """Stop the node: SIGTERM, SIGKILL after ``grace_s`` (0: at once). Thaws it first:
        a stopped JVM would ignore SIGTERM until continued."""
        process = self.process
        if process is None:
            return
        self.thaw()
        _terminate_group(process.pid, grace_s, process)

    def _signal(self, signum: signal.Signals) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signum)

    def __repr__(self) -> str:
        return f"<ClusterNode {self.node_id} port={self.port} pid={self.pid}>"


class LocalCluster(Broker):
    """Three (or ``brokers``) local nodes and, if proxied, the fault proxy clients go through.

    ``info.bootstrap_servers`` lists every node's advertised client address (the proxy's
    ports when proxied). :meth:`stop` stops the proxy and every node and deletes the
    directory; also at interpreter exit.
    """

    def __init__(
        self,
        info: BrokerInfo,
        nodes: list[ClusterNode],
        root: Path,
        proxy: FaultProxy | None,
    ) -> None:
        super().__init__(info)
        self.nodes = nodes
        self.root = root
        self.proxy = proxy
        self._lock = threading.Lock()
        self._stopped = False
        _LIVE_BROKERS.add(self)
        for node in nodes:
            node.on_spawn = self._write_owner

    def _write_owner(self) -> None:
        """The owner file the orphan sweep reads: this process and every node's JVM."""
        pids = [node.pid for node in self.nodes if node.pid is not None]
        _write_atomic(
            self.root / "owner.json", json.dumps({"owner_pid": os.getpid(), "java_pids": pids})
        )

    def node(self, node_id: int) -> ClusterNode:
        """The node whose ``node.id`` is ``node_id`` (1-based, as Kafka numbers them)."""
        return next(node for node in self.nodes if node.node_id == node_id)

    @property
    def direct_bootstrap_servers(self) -> str:
        """The nodes' real client addresses, past the proxy."""
        return ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        try:
            if self.proxy is not None:
                self.proxy.close()
            # the data is thrown away: no controlled shutdown, which would wait on a quorum
            # the other nodes are leaving at the same moment
            for node in self.nodes:
                node.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            _LIVE_BROKERS.discard(self)


def start_cluster(
    settings: Settings,
    *,
    brokers: int = 3,
    proxied: bool = False,
    progress: Progress | None = None,
) -> LocalCluster:
    """Start a throwaway cluster of ``brokers`` combined KRaft nodes (Maven jars, temp dir).

    Returns once every node answers ApiVersions; ``settings.kafka.local`` gives the Kafka
    version and the start timeout (each node's heap is :data:`CLUSTER_HEAP`, a third of a
    single broker's default, as three share the machine).
    """
    if brokers < REPLICATION_FACTOR:
        raise KafkaProviderError(
            f"a cluster needs at least {REPLICATION_FACTOR} brokers for replication factor "
            f"{REPLICATION_FACTOR}, not {brokers}"
        )
    say = progress or _stderr_progress
    java, libs = _java_and_jars(settings, say)
    started = time.monotonic()
    proxy = FaultProxy() if proxied else None
    try:
        with _temp_root() as root:
            nodes = _configure(root, brokers, java, libs, proxy)
            _format_all(java, libs, nodes, say)
    except BaseException:
        if proxy is not None:
            proxy.close()
        raise
    cluster = _handle(settings, root, nodes, proxy)
    try:
        say(f"starting {brokers} local Kafka {settings.kafka.local.version} nodes")
        # the JVMs start together: a node answers only once the quorum has a leader
        offsets = [node.spawn() for node in nodes]
        for node, offset in zip(nodes, offsets, strict=True):
            node.wait_ready(settings.kafka.local.start_timeout_s, offset)
    except BaseException:
        cluster.stop()
        raise
    say(
        f"local Kafka cluster ready at {cluster.bootstrap_servers} in "
        f"{time.monotonic() - started:.1f} s (pids {[node.pid for node in nodes]})"
    )
    return cluster


def _format_all(java: str, libs: Path, nodes: list[ClusterNode], say: Progress) -> None:
    """Format every node's storage under one new cluster id, all at once."""
    cluster_id = _cluster_id()
    say(f"formatting the storage of {len(nodes)} Kafka nodes under {nodes[0].root.parent}")
    with ThreadPoolExecutor(len(nodes)) as pool:
        formats = [
            pool.submit(_format_storage, java, libs, node.root, None, cluster_id) for node in nodes
        ]
        for done in formats:
            done.result()


def _configure(
    root: Path, brokers: int, java: str, libs: Path, proxy: FaultProxy | None
) -> list[ClusterNode]:
    """Every node's directory and ``server.properties``, and the proxy's routes."""
    ports = _free_ports(3 * brokers)
    client, inter, control = ports[:brokers], ports[brokers : 2 * brokers], ports[2 * brokers :]
    voters = ",".join(f"{i + 1}@127.0.0.1:{control[i]}" for i in range(brokers))
    overrides = {
        **_replication_config(REPLICATION_FACTOR, MIN_INSYNC_REPLICAS),
        "default.replication.factor": str(REPLICATION_FACTOR),
        "min.insync.replicas": str(MIN_INSYNC_REPLICAS),
    }
    nodes = []
    for i in range(brokers):
        node_root = root / f"node-{i + 1}"
        advertised = (
            proxy.add_route("127.0.0.1", client[i]).listen_port if proxy is not None else None
        )
        listeners = _listener_config(
            client[i], control[i], advertised_port=advertised, broker_port=inter[i]
        )
        _write_node_files(node_root, _node_config(node_root, i + 1, voters, listeners, overrides))
        nodes.append(ClusterNode(i + 1, node_root, client[i], java, libs, CLUSTER_HEAP))
    return nodes


def _handle(
    settings: Settings, root: Path, nodes: list[ClusterNode], proxy: FaultProxy | None
) -> LocalCluster:
    """The cluster's handle, before any node runs."""
    if proxy is not None:
        bootstrap = ",".join(route.address for route in proxy.routes)
        via = f", clients through the fault proxy (brokers at {_direct(nodes)})"
    else:
        bootstrap, via = _direct(nodes), ""
    detail = (
        f"{len(nodes)} Kafka {settings.kafka.local.version} nodes from Maven jars, "
        f"RF {REPLICATION_FACTOR}, min ISR {MIN_INSYNC_REPLICAS}{via}, logs {root}/node-*/server.log "
        "(temporary)"
    )
    return LocalCluster(BrokerInfo(bootstrap, "local", detail), nodes, root, proxy)


def _direct(nodes: list[ClusterNode]) -> str:
    return ",".join(f"127.0.0.1:{node.port}" for node in nodes)
