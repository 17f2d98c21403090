"""A real 3-node Apache Kafka cluster (KRaft) on 127.0.0.1: what production looks like, for the cluster stage.

Each node is a devtools.kafka_broker.LocalKafkaBroker in combined mode (controller and broker in one
JVM, as small production clusters run), on ports of its own (devtools.ports), all formatted with one
cluster id and voting in one controller quorum. Replication is what platform teams set: replication
factor 3 for new topics, the offsets topic and the transaction state log, `min.insync.replicas=2`
(so acks=all and transaction markers need two live replicas). Failure detection is shortened
(broker session 6 s, heartbeats 1 s) so a SIGKILLed node loses its leaderships and its coordinator
partitions within seconds, not the default 9 s + 30 s.

Faults: `kill(node_id)` SIGKILLs one node (no shutdown hook, as a lost machine), `restart(node_id)`
brings it back on its data; `pause(node_id)` SIGSTOPs one (a long GC pause, a hung machine: connections are
accepted by the kernel and never answered), `resume(node_id)` lets it go on; `transaction_coordinator(transactional_id)` asks FindCoordinator (through
DescribeTransactions) which node owns an id, `partition_leader(topic, partition)` reads the metadata.

Heap: 320 MiB per node (measured RSS about 0.5 GiB per node idle and under the cluster tests, docs/testing.md).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

from devtools.kafka_broker import LocalKafkaBroker, cluster_id
from devtools.ports import reserve_port

NODE_IDS = (1, 2, 3)
REPLICATION = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
}
# Seconds, not tens of seconds, between a SIGKILL and the controller fencing the node (leaders move, ISRs shrink).
FAILURE_DETECTION = {
    "broker.session.timeout.ms": "6000",
    "broker.heartbeat.interval.ms": "1000",
    "replica.lag.time.max.ms": "10000",
}
# Fewer threads and a smaller log cleaner buffer than the defaults: three JVMs share two cores.
SMALL_FOOTPRINT = {
    "num.network.threads": "2",
    "num.io.threads": "2",
    "background.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
}


class ClusterNode(LocalKafkaBroker):
    """One combined controller+broker node of a LocalKafkaCluster."""

    heap_options = ("-Xms128m", "-Xmx320m")

    def __init__(self, data_dir: Path, node_id: int, voters: str, storage_cluster_id: str, port: int,
                 controller_port: int, **kwargs: Any) -> None:
        super().__init__(data_dir, port=port, controller_port=controller_port, **kwargs)
        self.node_id = node_id
        self.voters = voters
        self.storage_cluster_id = storage_cluster_id

    def _storage_cluster_id(self) -> str:
        return self.storage_cluster_id

    def _wait_ready(self, timeout: float) -> None:
        """Once the node listens: a client that bootstraps earlier backs off up to 20 s between tries (kafka-python),
        which made a restart take half a minute more."""
        deadline = time.monotonic() + timeout
        while not _listening(self.port) and time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                break  # the base class reports the exit with the log's tail
            time.sleep(0.2)
        super()._wait_ready(max(1.0, deadline - time.monotonic()))

    def _config(self) -> dict[str, str]:
        return {**super()._config(), "node.id": str(self.node_id), "controller.quorum.voters": self.voters,
                **REPLICATION, **FAILURE_DETECTION, **SMALL_FOOTPRINT, **self.extra_config}


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex(("127.0.0.1", port)) == 0


class LocalKafkaCluster:
    """Start, stop, kill and restart the nodes of a 3-node KRaft cluster whose data lives in `data_dir`."""

    def __init__(self, data_dir: str | Path, transaction_max_timeout_ms: int = 900_000,
                 extra_config: dict[str, str] | None = None, version: str | None = None) -> None:
        self.data_dir = Path(data_dir)
        ports = {node_id: (reserve_port(), reserve_port()) for node_id in NODE_IDS}
        voters = ",".join(f"{node_id}@127.0.0.1:{controller}" for node_id, (_, controller) in ports.items())
        shared_id = cluster_id()
        self.nodes: dict[int, ClusterNode] = {
            node_id: ClusterNode(self.data_dir / f"node-{node_id}", node_id, voters, shared_id, port, controller,
                                 transaction_max_timeout_ms=transaction_max_timeout_ms,
                                 extra_config=extra_config, version=version)
            for node_id, (port, controller) in ports.items()}
        self.paused: set[int] = set()

    @property
    def bootstrap_servers(self) -> str:
        """Every node, as clients are configured for a cluster (any live one bootstraps)."""
        return ",".join(node.bootstrap_servers for node in self.nodes.values())

    def client_config(self) -> dict[str, Any]:
        """kafka-python keyword arguments of a client of the cluster."""
        return {"bootstrap_servers": self.bootstrap_servers}

    def start(self, timeout: float = 120.0) -> "LocalKafkaCluster":
        """Start every node at once (a node is ready only once a quorum of controllers runs), then wait for all
        three brokers to be registered."""
        self._each(lambda node: node.start(timeout), list(self.nodes.values()))
        self.wait_brokers(len(self.nodes), timeout)
        return self

    def stop(self) -> None:
        for node_id in list(self.paused):  # a stopped process would hold its SIGTERM until the stop's timeout
            self.resume(node_id)
        self._each(lambda node: node.stop(), list(self.nodes.values()))

    def __enter__(self) -> "LocalKafkaCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (controller and broker at once), as a lost machine."""
        self.node(node_id).kill()

    def pause(self, node_id: int) -> None:
        """SIGSTOP one node: it keeps its sockets, the kernel accepts connections, nothing answers."""
        os.kill(self._pid(node_id), signal.SIGSTOP)
        self.paused.add(node_id)

    def resume(self, node_id: int) -> None:
        """SIGCONT a paused node."""
        os.kill(self._pid(node_id), signal.SIGCONT)
        self.paused.discard(node_id)

    def _pid(self, node_id: int) -> int:
        process = self.node(node_id).process
        if process is None or process.poll() is not None:
            raise RuntimeError(f"node {node_id} does not run")
        return process.pid

    def restart(self, node_id: int, timeout: float = 120.0) -> None:
        """Start a killed or stopped node again on its data; returns once it is back in the cluster and every
        partition has all its replicas in sync again (so the next fault starts from a whole cluster)."""
        node = self.node(node_id)
        node.stop()
        node.start(timeout)
        self.wait_brokers(len(self.nodes), timeout)
        self.wait_in_sync(timeout)

    def node(self, node_id: int) -> ClusterNode:
        if node_id not in self.nodes:
            raise ValueError(f"no node {node_id} in the cluster; its nodes are {sorted(self.nodes)}")
        return self.nodes[node_id]

    def live_bootstrap(self) -> str:
        """The bootstrap servers of the nodes that run and are not paused (a test's own clients skip them)."""
        return ",".join(n.bootstrap_servers for node_id, n in self.nodes.items()
                        if n.process and n.process.poll() is None and node_id not in self.paused)

    # ----------------------------------------------------------------------- reading the cluster

    def _ask(self, question: Callable[[Any], Any], timeout: float = 60.0) -> Any:
        """`question(admin)` on a fresh admin client of the live nodes, asked again while the cluster does not
        answer (kafka-python's admin client sends to a node it knows from the metadata, a killed one included,
        and raises instead of trying another)."""
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError

        deadline = time.monotonic() + timeout
        while True:
            admin = None
            try:
                admin = KafkaAdminClient(bootstrap_servers=self.live_bootstrap(), request_timeout_ms=10_000)
                return question(admin)
            except KafkaError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the cluster did not answer within {timeout:.0f}s ({exc!r}); see the "
                                       f"nodes' broker.log under {self.data_dir}") from exc
                time.sleep(0.5)
            finally:
                if admin is not None:
                    admin.close()

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node id of the coordinator owning `transactional_id` (FindCoordinator, through DescribeTransactions:
        a fresh client has no cached answer). The id must be known to the cluster (InitProducerId ran)."""
        return self._ask(lambda admin: admin.describe_transactions([transactional_id])[transactional_id]
                         .coordinator_id)

    def partition_leader(self, topic: str, partition: int) -> int:
        """The node id leading `topic`'s `partition` (-1 while it has none)."""
        return self.partitions(topic)[partition]["leader_id"]

    def partitions(self, topic: str) -> dict[int, dict[str, Any]]:
        """`topic`'s partitions as the metadata describes them: leader_id, replica_nodes, isr_nodes."""
        described = self._ask(lambda admin: admin.describe_topics([topic]))[0]
        return {p["partition_index"]: p for p in described["partitions"]}

    def create_topic(self, topic: str, partitions: int = 3) -> None:
        """A topic replicated on all three nodes; returns once every partition has a leader and its full ISR."""
        self._ask(lambda admin: admin.create_topics(
            {topic: {"num_partitions": partitions, "replication_factor": len(self.nodes)}}, wait_for_metadata=True))
        self.wait_in_sync(60.0, [topic])

    def open_transactions(self, transactional_id_prefix: str) -> dict[str, str]:
        """Transactional ids starting with the prefix that the coordinators list as not ended
        (ListTransactions on every node, states Ongoing, PrepareCommit, PrepareAbort)."""
        listed = self._ask(lambda admin: admin.list_transactions())
        return {row.transactional_id: row.state.value for rows in listed.values() for row in rows
                if row.transactional_id.startswith(transactional_id_prefix)
                and row.state.value in ("Ongoing", "PrepareCommit", "PrepareAbort")}

    def wait_brokers(self, count: int, timeout: float = 60.0) -> None:
        """Until `count` brokers are registered with the controller (a restarted node is back)."""
        deadline = time.monotonic() + timeout
        while len(self._ask(lambda admin: admin.describe_cluster()["brokers"], timeout)) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not show {count} brokers within {timeout:.0f}s; "
                                   f"see the nodes' broker.log under {self.data_dir}")
            time.sleep(0.5)

    def wait_in_sync(self, timeout: float = 60.0, topics: list[str] | None = None) -> None:
        """Until every partition (of `topics`, default all, internal ones included) has a leader and all its
        replicas in its ISR."""
        deadline = time.monotonic() + timeout
        while True:
            described = self._ask(lambda admin: admin.describe_topics(topics), timeout)
            behind = [f"{t['name']}-{p['partition_index']}" for t in described for p in t["partitions"]
                      if p["leader_id"] < 0 or len(p["isr_nodes"]) < len(p["replica_nodes"])]
            behind += [t["name"] for t in described if not t["partitions"]]  # created, not yet in the metadata
            if not behind:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"partitions not in sync within {timeout:.0f}s: {', '.join(behind[:10])}")
            time.sleep(0.5)

    @staticmethod
    def _each(action: Any, nodes: list[ClusterNode]) -> None:
        """`action(node)` for every node in threads of its own; the first error is raised after all ended."""
        errors: list[BaseException] = []

        def run(node: ClusterNode) -> None:
            try:
                action(node)
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(node,), name=f"kafka-node-{node.node_id}") for node in nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
