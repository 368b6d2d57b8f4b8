"""A real Redis Cluster on loopback: three primaries, three replicas, ours to break.

    cluster = RedisCluster(workdir, spawn)   # spawn(name, argv) -> Popen
    cluster.start()                          # six redis-servers, joined, slots covered
    cluster.kill_primary(rng)                # SIGKILL one; its replica takes over
    cluster.close()

Each node is `redis-server --cluster-enabled yes` on a free port with its own
cluster-config file, nothing kept on disk; `redis-cli --cluster create` joins them.
A killed primary is started again on its port and config file, so it comes back as
the replica of the node that replaced it, as a restarted machine would.
"""

import random
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis

from tests.servers import wait_for_port

Spawn = Callable[..., subprocess.Popen]


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_ports(count: int, rng: random.Random) -> list[int]:
    """Free ports whose cluster bus port (the port + 10000) is free and valid too."""
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(20000, 40000)
        if port not in ports and _free(port) and _free(port + 10000):
            ports.append(port)
    return ports


class RedisCluster:
    def __init__(self, workdir: Path, spawn: Spawn, nodes: int = 6) -> None:
        self.workdir, self.spawn = workdir / "redis-cluster", spawn
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ports = cluster_ports(nodes, random.Random())
        self.processes: dict[int, subprocess.Popen] = {}
        self.failovers = 0

    @property
    def url(self) -> str:
        """One node's URL: a cluster client finds the others from it."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start_node(self, port: int) -> None:
        self.processes[port] = self.spawn(
            f"redis-cluster-{port}",
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(self.workdir / f"nodes-{port}.conf"),
                "--cluster-node-timeout",
                "2000",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
        )
        if not wait_for_port(port):
            raise RuntimeError(f"redis-server on {port} never came up")

    def start(self) -> None:
        for port in self.ports:
            self.start_node(port)
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{port}" for port in self.ports),
                "--cluster-replicas",
                "1",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_until_ok()

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2)

    def wait_until_ok(self, seconds: float = 60) -> None:
        """Until every live node says the cluster is ok with three primaries."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                live = [p for p, proc in self.processes.items() if proc.poll() is None]
                if (
                    all(
                        self.node(p).cluster("info")["cluster_state"] == "ok"
                        for p in live
                    )
                    and len(self.primaries()) == len(self.ports) // 2
                ):
                    return
            except redis.RedisError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the Redis Cluster did not become ok")

    def primaries(self) -> list[int]:
        """The ports of the primaries that serve slots, as a live node sees them."""
        for port, process in self.processes.items():
            if process.poll() is None:
                try:
                    shards = self.node(port).execute_command("CLUSTER", "SLOTS")
                except redis.RedisError:
                    continue
                return sorted({int(shard[2][1]) for shard in shards})
        return []

    def kill_primary(self, rng: random.Random) -> int:
        """SIGKILL one primary, wait for its replica's promotion, start it again
        (it rejoins as a replica); return the killed port."""
        port = rng.choice(self.primaries())
        victim = self.processes[port]
        victim.kill()
        victim.wait(timeout=10)
        deadline = time.monotonic() + 60
        while port in self.primaries():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no replica took over from {port}")
            time.sleep(0.2)
        self.failovers += 1
        self.start_node(port)
        self.wait_until_ok()
        return port
