"""A real Ray head on loopback for the tests of remote tasks (`ray start --head --block`).

Every port is a free one picked here (two heads on one machine must not collide), the temp
dir is short (Ray's unix sockets live under it), and the head is stopped by its own process
group: never `ray stop`, which kills every Ray process of the machine. Tests that need the
head are marked `ray_head` and run in one xdist group, so one head serves them all.
"""

from __future__ import annotations

import contextlib
import os
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
RAY_REQUIRED = "Ray is required: pip install -e '.[test]' installs ray[default]"


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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
    """The first of `width` consecutive ports that are free now (for Ray's worker ports)."""
    for _ in range(200):
        (base,) = _free_ports(1)
        if base + width < 65000 and _range_free(base, width):
            return base
    raise RuntimeError("no free port range for Ray's workers")


class RayHead:
    """One loopback head: `address` is its dashboard (the Jobs API)."""

    def __init__(self, num_cpus: int = 4) -> None:
        if not Path(RAY).exists():
            raise RuntimeError(RAY_REQUIRED)
        self.temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
        (gcs, dash, client, agent_http, agent_grpc, metrics, node, objects, runtime_env) = (
            _free_ports(9)
        )
        workers = _free_range(40)
        self.address = f"http://127.0.0.1:{dash}"
        self.log = self.temp / "head.log"
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
            "--num-cpus", str(num_cpus),
        ]  # fmt: skip
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        if not poll(self._answers, START_TIMEOUT_S, interval=0.2):
            tail = self.log.read_text(errors="replace")[-3000:]
            self.stop()
            raise RuntimeError(f"the Ray head did not answer at {self.address}:\n{tail}")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            return True  # (it died: the caller sees that below)
        try:
            with urllib.request.urlopen(f"{self.address}/api/version", timeout=2) as r:
                return bool(r.status == 200)
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
