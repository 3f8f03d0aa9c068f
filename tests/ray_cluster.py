"""A real local multi-node Ray cluster for the tests and docs/cluster.md's measured run.

Each node is its own ``ray start --block`` process in a session of its own, so that every
process it starts (GCS, raylet, agents, workers and the cells they run) is in one process
group that :meth:`LocalCluster.kill` and :meth:`LocalCluster.stop` end by its id, and
nothing else on the machine (``ray stop`` would end every Ray process of the host).

Example::

    with LocalCluster() as cluster:
        cluster.add_worker("a", {"gpu:Test GPU A": 1})
        ...  # python -m gate_residual_matrix matrix --cluster cluster.client_address
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
# Faster death detection than Ray's defaults (a node is declared dead after health checks
# fail): the tests kill workers on purpose. Set for every node of the local cluster.
FAST_HEALTH = {"RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "1000",
               "RAY_health_check_failure_threshold": "3", "RAY_USAGE_STATS_ENABLED": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """A head (no CPU: it runs no cell) and the workers added with :meth:`add_worker`."""

    def __init__(self, *, head_cpus: int = 0) -> None:
        self.temp = Path(tempfile.mkdtemp(prefix="gr-ray-", dir="/tmp"))  # short socket paths
        self.tmpdir = self.temp / "tmp"  # the nodes' TMPDIR: what a killed task left goes too
        self.tmpdir.mkdir()
        self.port, self.client_port = free_port(), free_port()
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self._start("head", ["--head", f"--port={self.port}", f"--num-cpus={head_cpus}",
                             f"--ray-client-server-port={self.client_port}",
                             "--include-dashboard=false", f"--temp-dir={self.temp}",
                             "--disable-usage-stats"], {})
        self.wait_for_nodes(1)

    @property
    def address(self) -> str:
        """The GCS address (``HOST:PORT``)."""
        return f"127.0.0.1:{self.port}"

    @property
    def client_address(self) -> str:
        """The Ray Client address (``ray://HOST:PORT``)."""
        return f"ray://127.0.0.1:{self.client_port}"

    def _start(self, name: str, args: list[str], env: dict) -> None:
        log = self.temp / f"{name}.log"
        self.logs[name] = log
        with open(log, "ab") as out:
            self.procs[name] = subprocess.Popen(
                [RAY, "start", "--block", *args], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, **FAST_HEALTH, "TMPDIR": str(self.tmpdir), **env})

    def add_worker(self, name: str, resources: dict, *, cpus: int = 1,
                   env: dict | None = None) -> None:
        """Start a worker node offering ``resources`` and ``cpus`` CPUs (its cells see
        ``env`` added to this process's environment) and wait until it has joined (one at a
        time: two nodes of one host that start at once can collide)."""
        self._start(name, [f"--address={self.address}", f"--num-cpus={cpus}",
                           f"--resources={json.dumps(resources)}"], env or {})
        self.wait_for_nodes(len(self.alive()))

    def alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def wait_for_nodes(self, count: int, timeout_s: float = 90.0) -> None:
        """Until the cluster's GCS lists ``count`` live nodes (``ray list nodes``-free: the
        ``ray status`` of the head), or RuntimeError with the nodes' logs' tails."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None and name in self.logs and name == "head":
                    raise RuntimeError(f"ray head exited: {self._tail('head')}")
            if self.live_nodes() >= count:
                return
            time.sleep(0.5)
        raise RuntimeError(f"{count} Ray node(s) did not come up; ray status: {self._status()}")

    def live_nodes(self) -> int:
        """How many nodes ``ray status`` lists before its ``Pending:`` part (whether it
        calls them active or idle); 0 while it cannot tell."""
        try:
            out = subprocess.run([RAY, "status", f"--address={self.address}"],
                                 capture_output=True, text=True, timeout=60,
                                 env={**os.environ, **FAST_HEALTH})
        except subprocess.TimeoutExpired:
            return 0
        listed = out.stdout.split("Pending:")[0]
        return len(re.findall(r"^\s*1 node_[0-9a-f]+\s*$", listed, flags=re.MULTILINE))

    def _status(self) -> str:
        out = subprocess.run([RAY, "status", f"--address={self.address}"], capture_output=True,
                             text=True, timeout=60)
        return (out.stdout + out.stderr)[-3000:]

    def _tail(self, name: str) -> str:
        try:
            return self.logs[name].read_text(errors="replace")[-1500:]
        except OSError:
            return ""

    def kill(self, name: str) -> None:
        """SIGKILL node ``name``'s whole process group: the node dies as a machine would."""
        proc = self.procs[name]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def stop(self) -> None:
        """End every process this cluster started: SIGTERM to each node's process group,
        SIGKILL to what is left after a few seconds; remove the temp dir."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in self.procs.values():
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            for proc in self.procs.values():
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        shutil.rmtree(self.temp, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
