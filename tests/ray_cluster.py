"""A real Ray head on loopback for the tests of remote tasks (`ray start --head --block`).

Every port is a free one picked here (two heads on one machine must not collide), the temp
dir is short (Ray's unix sockets live under it), and the head is stopped by its own process
group: never `ray stop`, which kills every Ray process of the machine. Tests that need the
head are marked `ray_head` and run in one xdist group, so one head serves them all. A test
that needs a second node joins one to the head (`RayWorkerNode`, stopped at its end).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import psutil

from tests.polling import poll

# `ray` is installed beside the interpreter (a version manager's shims may not know it).
RAY = str(Path(sys.executable).parent / "ray")
START_TIMEOUT_S = 120.0
START_ATTEMPTS = 3
RAY_REQUIRED = "Ray is required: pip install -e '.[test]' installs ray[default]"


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (Linux's default: 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _range_free(base: int, width: int) -> bool:
    held: list[socket.socket] = []
    try:
        for port in range(base, base + width):
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for s in held:
            s.close()


def _free_range(width: int) -> int:
    """The first of `width` consecutive ports free now, below the ephemeral range.

    Ports from `bind(0)` are ephemeral ones: between picking such a port and the head binding
    it, any process's outgoing connection may take it as its local port (the suite runs many
    at once). Below the ephemeral range only another listener can."""
    top = min(_ephemeral_low(), 65000) - width
    for _ in range(500):
        base = random.randrange(10000, top)
        if _range_free(base, width):
            return base
    raise RuntimeError("no free port range below the ephemeral ports for a Ray head")


HEAD_RESOURCE = "shoal_head"
"""The head's own custom resource (one unit): a task that requires it runs on the head."""


class RayHead:
    """One loopback head: `address` is its dashboard (the Jobs API), `gcs` what another node
    joins (`ray start --address`)."""

    def __init__(self, num_cpus: int = 4) -> None:
        if not Path(RAY).exists():
            raise RuntimeError(RAY_REQUIRED)
        self.num_cpus = num_cpus
        self.gcs = ""
        self.temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
        self.log = self.temp / "head.log"
        self.address = ""
        for attempt in range(1, START_ATTEMPTS + 1):
            self._start()
            if not poll(self._answers, START_TIMEOUT_S, interval=0.2):
                tail = self.log.read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"the Ray head did not answer at {self.address}:\n{tail}")
            if self.alive():
                return
            # It died before answering: most likely another listener took one of its ports.
            tail = self.log.read_text(errors="replace")[-3000:]
            self.kill()
            if attempt == START_ATTEMPTS:
                shutil.rmtree(self.temp, ignore_errors=True)
                raise RuntimeError(
                    f"the Ray head exited before answering, {START_ATTEMPTS} times "
                    f"(exit code {self.proc.returncode}); its log's end:\n{tail}"
                )
            shutil.rmtree(self.temp / "t", ignore_errors=True)

    def _start(self) -> None:
        """`ray start --head --block` on fresh ports, its output to `self.log`."""
        base = _free_range(9 + 40)
        (gcs, dash, client, agent_http, agent_grpc, metrics, node, objects, runtime_env) = range(
            base, base + 9
        )
        workers = base + 9
        self.address = f"http://127.0.0.1:{dash}"
        self.gcs = f"127.0.0.1:{gcs}"
        env = {
            **os.environ,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            # The jobs' `shoal` is the one under test, found beside this interpreter.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        env.pop("RAY_ADDRESS", None)
        argv = [
            RAY, "start", "--head", "--block", "--disable-usage-stats",
            "--node-ip-address", "127.0.0.1", "--port", str(gcs),
            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
            "--include-dashboard", "true", "--ray-client-server-port", str(client),
            "--dashboard-agent-listen-port", str(agent_http),
            "--dashboard-agent-grpc-port", str(agent_grpc),
            "--metrics-export-port", str(metrics), "--node-manager-port", str(node),
            "--object-manager-port", str(objects), "--runtime-env-agent-port", str(runtime_env),
            "--min-worker-port", str(workers), "--max-worker-port", str(workers + 39),
            "--temp-dir", str(self.temp / "t"), "--object-store-memory", "100000000",
            "--num-cpus", str(self.num_cpus), "--resources", f'{{"{HEAD_RESOURCE}": 1}}',
        ]  # fmt: skip
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            return True  # (it died: the caller sees that below)
        try:
            # (its dashboard answers some seconds before it lists its own node)
            with urllib.request.urlopen(f"{self.address}/api/v0/nodes", timeout=5) as r:
                return bool(r.status == 200) and b'"state": "ALIVE"' in r.read()
        except OSError:
            return False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _tree(self) -> list[psutil.Process]:
        """The head and everything under it (jobs run in sessions of their own, so its
        process group alone would miss them)."""
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """kill -9 the whole head (GCS, raylet, dashboard, and the jobs under it)."""
        for proc in self._tree():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)

    def stop(self) -> None:
        """TERM the head's tree, KILL what is left after a few seconds; remove its temp dir."""
        tree = self._tree()
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(tree, timeout=5)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        shutil.rmtree(self.temp, ignore_errors=True)


class RayWorkerNode(RayHead):
    """A second node joined to `head` on loopback (`ray start --address`), named `name` (its
    joblog host) with one unit of the custom resource `resource`; stopped as a head is."""

    def __init__(self, head: RayHead, name: str, resource: str, num_cpus: int = 2) -> None:
        self.head, self.name, self.resource, self.num_cpus = head, name, resource, num_cpus
        self.temp = Path(tempfile.mkdtemp(prefix="raynode", dir="/tmp"))
        self.log = self.temp / "node.log"
        self.address = head.address
        base = _free_range(7 + 40)
        node, objects, runtime_env, agent_http, agent_grpc, metrics = range(base, base + 6)
        workers = base + 7
        env = {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        env.pop("RAY_ADDRESS", None)
        # `ray start --address 127.0.0.1:P` swaps 127.0.0.1 for the machine's address, where
        # the loopback head's GCS does not listen: spelled so, it is the same address unswapped.
        join = head.gcs.replace("127.0.0.1:", "127.000.000.001:")
        argv = [
            RAY, "start", "--address", join, "--block", "--disable-usage-stats",
            "--node-ip-address", "127.0.0.1", "--node-name", name,
            "--resources", f'{{"{resource}": 1}}', "--num-cpus", str(num_cpus),
            "--node-manager-port", str(node), "--object-manager-port", str(objects),
            "--runtime-env-agent-port", str(runtime_env),
            "--dashboard-agent-listen-port", str(agent_http),
            "--dashboard-agent-grpc-port", str(agent_grpc),
            "--metrics-export-port", str(metrics),
            "--min-worker-port", str(workers), "--max-worker-port", str(workers + 39),
            "--object-store-memory", "100000000",
        ]  # fmt: skip
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        if not poll(self._joined, START_TIMEOUT_S, interval=0.5) or not self.alive():
            tail = self.log.read_text(errors="replace")[-3000:]
            self.stop()
            raise RuntimeError(f"the Ray node {name} did not join {head.gcs}:\n{tail}")

    def _joined(self) -> bool:
        if self.proc.poll() is not None:
            return True  # (it died: the caller sees that)
        try:
            with urllib.request.urlopen(f"{self.head.address}/api/v0/nodes", timeout=5) as r:
                rows = json.loads(r.read())["data"]["result"]["result"]
        except (OSError, ValueError, KeyError):
            return False
        return any(n.get("node_name") == self.name and n.get("state") == "ALIVE" for n in rows)
