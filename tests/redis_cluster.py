"""A real Redis Cluster for tests: three primaries and three replicas on loopback.

Six `redis-server --cluster-enabled yes` processes on free ports, joined by
`redis-cli --cluster create ... --cluster-replicas 1`, each in its own process group
and killed, group and all, by `stop()`. A short node timeout (one second) lets a
replica take over a killed primary in about two.
"""

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from redis.crc import key_slot

from ledger.supervisor import claim
from tests.servers import wait_for_port

NODE_TIMEOUT_MS = 1000


def free_cluster_port(taken: set[int]) -> int:
    """A port P with P and its cluster bus port P + 10000 both free, below the
    ephemeral range, so no outgoing connection takes either meanwhile; both claimed,
    so that `free_port` never hands out either."""
    while True:
        port = random.randrange(10000, 22000)
        if port not in taken and claim(port) and claim(port + 10000):
            return port


class OwnCluster:
    """`spawn(name, argv)`, when given, starts each node (bench/cluster.py's, which
    also kills what is left if the runner dies); by default a process group of its
    own, killed by `stop()`."""

    def __init__(
        self,
        directory: Path,
        nodes: int = 6,
        spawn: Callable[[str, list[str]], subprocess.Popen] | None = None,
    ) -> None:
        self.directory = directory
        self.spawn = spawn
        self.failovers = 0
        self.ports: list[int] = []
        for _ in range(nodes):
            self.ports.append(free_cluster_port(set(self.ports)))
        self.processes: dict[int, subprocess.Popen] = {}

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start_node(self, port: int) -> None:
        config = self.directory / f"nodes-{port}.conf"
        command = [
            "redis-server",
            *("--port", str(port), "--bind", "127.0.0.1"),
            *("--cluster-enabled", "yes", "--cluster-config-file", str(config)),
            *("--cluster-node-timeout", str(NODE_TIMEOUT_MS)),
            *("--dir", str(self.directory), "--save", "", "--appendonly", "no"),
            *("--repl-diskless-sync-delay", "0"),
        ]
        if self.spawn is not None:
            self.processes[port] = self.spawn(f"redis-cluster-{port}", command)
        else:
            log = (self.directory / f"redis-{port}.log").open("a")
            self.processes[port] = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            log.close()
        assert wait_for_port(port), f"redis-server on {port} did not start"

    def start(self) -> None:
        for port in self.ports:
            self.start_node(port)
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        options = ["--cluster-replicas", "1", "--cluster-yes"]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *nodes, *options],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_until_whole()

    def cli(self, port: int, *args: str) -> str:
        result = subprocess.run(
            ["redis-cli", "-p", str(port), *args],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return result.stdout

    def alive(self) -> list[int]:
        return [p for p, process in self.processes.items() if process.poll() is None]

    def nodes(self) -> list[dict]:
        """`CLUSTER NODES` as one live node sees it."""
        rows = []
        for line in self.cli(self.alive()[0], "cluster", "nodes").splitlines():
            fields = line.split()
            if len(fields) < 8:
                continue
            slots = []
            for part in fields[8:]:
                if part.startswith("["):
                    continue  # a slot being migrated
                first, _, last = part.partition("-")
                slots.append((int(first), int(last or first)))
            rows.append(
                {
                    "port": int(fields[1].split("@")[0].rsplit(":", 1)[1]),
                    "flags": set(fields[2].split(",")),
                    "linked": fields[7] == "connected",
                    "slots": slots,
                }
            )
        return rows

    def primary_for(self, key: str) -> int:
        """The port of the live primary serving `key`'s hash slot, or 0."""
        slot = key_slot(key.encode())
        for node in self.nodes():
            serving = any(first <= slot <= last for first, last in node["slots"])
            if serving and "master" in node["flags"] and "fail" not in node["flags"]:
                return node["port"] if node["port"] in self.alive() else 0
        return 0

    def primaries(self) -> list[int]:
        return [n["port"] for n in self.nodes() if "master" in n["flags"]]

    def whole(self) -> bool:
        """Every live node says the cluster is ok, and every primary has a replica
        that is in sync with it (so killing a primary loses at most the last
        moment's writes, and its replica may take over)."""
        for port in self.alive():
            if "cluster_state:ok" not in self.cli(port, "cluster", "info"):
                return False
        primaries = [
            n["port"]
            for n in self.nodes()
            if "master" in n["flags"] and "fail" not in n["flags"] and n["slots"]
        ]
        if len(primaries) != 3:
            return False
        for port in primaries:
            info = self.cli(port, "info", "replication")
            if "state=online" not in info:
                return False
        return True

    def wait_until_whole(self, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.whole():
                return
            time.sleep(0.1)
        raise AssertionError(f"the Redis Cluster is not whole:\n{self.nodes()}")

    def kill(self, port: int) -> None:
        """SIGKILL one node: no goodbye to its peers, as when its host dies."""
        with suppress(ProcessLookupError):
            self.processes[port].send_signal(signal.SIGKILL)
        self.processes[port].wait(timeout=10)

    def wait_for_new_primary(self, key: str, old: int, seconds: float = 30) -> int:
        """Wait until a replica has taken over `key`'s slot from the dead `old`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            port = self.primary_for(key)
            if port and port != old:
                return port
            time.sleep(0.05)
        raise AssertionError(f"no replica took over from {old}:\n{self.nodes()}")

    def fail_over(self, rng: random.Random) -> int:
        """SIGKILL a primary, wait for its replica to take its slots, start it again
        (it rejoins as a replica, as a rebooted machine would); return its port."""
        port = rng.choice([p for p in self.primaries() if p in self.alive()])
        self.kill(port)
        deadline = time.monotonic() + 30
        while not self.nodes_agree(port):
            if time.monotonic() > deadline:
                raise AssertionError(f"no replica took over from {port}")
            time.sleep(0.1)
        self.failovers += 1
        self.start_node(port)
        self.wait_until_whole()
        return port

    def nodes_agree(self, dead: int) -> bool:
        """Every slot is served by a primary other than `dead`."""
        served = sum(
            last - first + 1
            for n in self.nodes()
            if "master" in n["flags"] and "fail" not in n["flags"] and n["port"] != dead
            for first, last in n["slots"]
        )
        return served == 16384

    def flush(self) -> None:
        for port in self.primaries():
            if port in self.alive():
                self.cli(port, "flushall")

    def stop(self) -> None:
        """Kill every node at once (they keep nothing worth a clean shutdown)."""
        for process in self.processes.values():
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in self.processes.values():
            process.wait(timeout=10)
