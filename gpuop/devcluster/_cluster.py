"""The local control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, on loopback, with simulated GPU nodes.

Everything lives in one state directory: PKI, kubeconfig, etcd data, logs and a
state file of the pids we started. ``down`` reads that file, so it works from a
different process than ``up`` and after a crash.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from ._pki import Pki

from gpuop.progress import Progress

from . import _argv, _procs
from ._argv import ClientTuning
from ._build import KWOK_STAGES, ensure_binaries
from ._errors import ClusterError, PortTaken
from ._nodes import node_manifests
from ._populate import create_nodes, publish_dra, wait_default_service_account, wait_nodes_ready
from ._versions import BinaryPaths, Versions

_STATE = "state.json"
NODE_IMAGES = "node-images"
"""The simulator's process name (its log: ``logs/node-images.log``)."""
_START_TIMEOUT = 120.0
#: Written first by ``up``: only a directory bearing it is ever deleted from.
MARKER = ".gpuop-cluster"
#: Everything ``up`` creates in the directory; ``down`` deletes these and nothing else.
_CREATED = (
    _STATE,
    "state.tmp",
    "pki",
    "etcd",
    "logs",
    "kubeconfig",
    "kwok.yaml",
    "scheduler.yaml",
    "audit-policy.yaml",
)


def default_dir() -> Path:
    """``$GPUOP_CLUSTER_DIR``, else ``$XDG_STATE_HOME/gpuop/cluster``."""
    explicit = os.environ.get("GPUOP_CLUSTER_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "gpuop" / "cluster"


PORT_ATTEMPTS = 3
"""How many times ``up`` starts over when a port it picked was taken meanwhile."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _check_port(port: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as err:
            raise ClusterError(
                f"port {port} on 127.0.0.1 is in use ({err.strerror})",
                "stop whatever listens there or pick another with --port",
            ) from err
    return port


@dataclass
class ClusterInfo:
    """What a client needs: where the API server is and how to authenticate."""

    directory: Path
    server: str
    kubeconfig: Path
    ports: dict[str, int] = field(default_factory=dict)


class LocalCluster:
    """One local control plane rooted at ``directory``."""

    def __init__(
        self,
        directory: Path | None = None,
        versions: Versions | None = None,
        tuning: ClientTuning | None = None,
        audit_policy: Mapping[str, Any] | None = None,
    ) -> None:
        self.directory = (directory or default_dir()).resolve()
        self.versions = versions or Versions.from_env()
        self.tuning = tuning or ClientTuning()
        #: An audit.k8s.io/v1 Policy; when set, kube-apiserver writes a JSON audit
        #: log to ``audit_log`` (off by default: benchmarks use it to attribute requests).
        self.audit_policy = audit_policy
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._records: list[_procs.ProcRecord] = []
        #: Whether ``up`` runs the node-image simulator (and kwok holds its pods).
        self._node_images = False

    # ----------------------------------------------------------------- paths
    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def _state_file(self) -> Path:
        return self.directory / _STATE

    @property
    def audit_log(self) -> Path:
        return self.directory / "logs" / "audit.log"

    def _log(self, name: str) -> Path:
        return self.directory / "logs" / f"{name}.log"

    # ----------------------------------------------------------------- status
    def running(self) -> list[str]:
        """Names of recorded processes that are still alive."""
        records, _ = _procs.load(self._state_file)
        return [r.name for r in records if _procs.is_alive(r)]

    def recorded(self) -> list[str]:
        """Names of every process the state file records, alive or not."""
        records, _ = _procs.load(self._state_file)
        return [r.name for r in records]

    def pids(self) -> dict[str, int]:
        """Pid of each recorded process that is still alive, by name (benchmarks read
        their CPU time from ``/proc``)."""
        records, _ = _procs.load(self._state_file)
        return {r.name: r.pid for r in records if _procs.is_alive(r)}

    def info(self) -> ClusterInfo | None:
        records, extra = _procs.load(self._state_file)
        if not records:
            return None
        ports = {str(k): int(v) for k, v in dict(extra.get("ports", {})).items()}  # type: ignore[call-overload]
        return ClusterInfo(
            directory=self.directory,
            server=str(extra.get("server", "")),
            kubeconfig=self.kubeconfig,
            ports=ports,
        )

    # ------------------------------------------------------------- directory
    @property
    def _marker(self) -> Path:
        return self.directory / MARKER

    def _ownership(self) -> dict[str, Any] | None:
        """The marker's content when gpuop made this directory a cluster directory.

        A directory from before the marker existed counts as ours only when it holds
        a state file and nothing but what ``up`` creates."""
        try:
            data = json.loads(self._marker.read_text())
            return data if isinstance(data, dict) else {}
        except FileNotFoundError:
            pass
        except (OSError, ValueError):
            return {}  # present but unreadable: still our marker
        names = {p.name for p in self.directory.iterdir()}
        if _STATE in names and names <= set(_CREATED):
            return {"created_dir": False}
        return None

    def _refuse(self, action: str) -> ClusterError:
        return ClusterError(
            f"refusing to {action} {self.directory}: it is not a gpuop cluster directory "
            f"(no {MARKER} in it)",
            "pass --dir a new or empty directory",
        )

    def _claim(self) -> None:
        """Make the directory ours before anything is written into it."""
        created = not self.directory.exists()
        if created:
            self.directory.mkdir(parents=True)
        elif not self.directory.is_dir():
            raise ClusterError(f"{self.directory} is not a directory", "pass --dir a directory")
        else:
            owned = self._ownership()
            if owned is None and any(self.directory.iterdir()):
                raise self._refuse("use")
            created = bool((owned or {}).get("created_dir", False))
        marker = {"created_by": "gpuop cluster up", "created_dir": created}
        self._marker.write_text(json.dumps(marker))

    # ------------------------------------------------------------------- down
    def down(self) -> list[str]:
        """Stop every process this directory recorded and delete what ``up`` created.

        Only a directory bearing the marker is touched, and in it only the entries
        ``up`` creates; the directory itself goes only if ``up`` created it and
        nothing else was put into it meanwhile.
        """
        if not self.directory.is_dir():
            stopped = _procs.terminate([], self._children)
            self._children.clear()
            self._records = []
            return stopped
        owned = self._ownership()
        if owned is None:
            if any(self.directory.iterdir()):
                raise self._refuse("delete from")
            return []  # an empty directory of someone else's: nothing of ours in it
        records, _ = _procs.load(self._state_file)
        stopped = _procs.terminate(records, self._children)
        self._children.clear()
        self._records = []
        for name in _CREATED:
            path = self.directory / name
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.is_dir():
                shutil.rmtree(path)
        if all(p.name == MARKER for p in self.directory.iterdir()):
            self._marker.unlink(missing_ok=True)
            if owned.get("created_dir"):
                self.directory.rmdir()
        return stopped

    # --------------------------------------------------------------------- up
    def up(
        self,
        nodes: int = 3,
        gpu_nodes: int = 2,
        apiserver_port: int | None = None,
        tie_to_parent: bool = False,
        dra: bool = True,
        workloads: Mapping[str, str] | None = None,
        node_images: bool = False,
    ) -> ClusterInfo:
        """Build (if needed) and start everything, create nodes, wait until Ready.

        With ``dra`` each simulated GPU node's GPUs are published as DRA devices
        (``ResourceSlice``s of ``gpu.nvidia.com``, see ``_dra``), so claims allocate.

        ``workloads`` (GPU node name to workload) labels those nodes
        ``nvidia.com/gpu.workload.config``: VM hosts for a mixed fleet.

        ``node_images`` also runs the node-image simulator (``node_images``): driver
        pods then wait for its driver-manager steps and operand pods for their
        status files, and kwok holds those pods until it releases them.

        A stale state from a crashed run in the same directory is cleaned first.
        ``tie_to_parent`` makes the kernel stop the processes when this process
        dies (used by test fixtures); the CLI leaves them running detached.
        """
        node_manifests(nodes, gpu_nodes, workloads)  # validate before any work
        if self.running():
            raise ClusterError(
                f"a cluster is already running in {self.directory}",
                "use it, or stop it first with `gpuop cluster down`",
            )
        self.down()
        self._node_images = node_images
        bins = ensure_binaries(self.versions)
        # Ports we picked ourselves may be taken by another process before ours binds
        # them (parallel clusters, test runs): start again on fresh ones, a few times.
        attempts = 1 if apiserver_port else PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            port = _check_port(apiserver_port) if apiserver_port else _free_port()
            self._claim()
            try:
                info = self._start(bins, port, tie_to_parent)
                asyncio.run(self._populate(nodes, gpu_nodes, dra, workloads))
            except PortTaken as err:
                self.down()
                if attempt == attempts:
                    raise
                print(f"{err.cause}; starting again on other ports", file=sys.stderr)
                continue
            except BaseException:
                self.down()
                raise
            return info
        raise AssertionError("unreachable")

    def _spawn(
        self,
        name: str,
        argv: list[str],
        tie_to_parent: bool,
        env: Mapping[str, str] | None = None,
    ) -> None:
        environ = {**os.environ, **(env or {})}
        proc, record = _procs.spawn(name, argv, self._log(name), environ, tie_to_parent)
        self._children[proc.pid] = proc
        self._records.append(record)
        _procs.save(self._state_file, self._records, self._state_extra)

    def _start(self, bins: BinaryPaths, api_port: int, tie: bool) -> ClusterInfo:
        from . import _pki  # cryptography is only needed to start a cluster

        progress = Progress("control plane", total=6)
        pki = _pki.generate(self.directory / "pki")
        ports = {
            "apiserver": api_port,
            "etcd": _free_port(),
            "etcd-peer": _free_port(),
            "controller-manager": _free_port(),
            "scheduler": _free_port(),
            "kwok": _free_port(),
        }
        server = f"https://127.0.0.1:{api_port}"
        audit_flags: list[str] = []
        if self.audit_policy is not None:
            policy_file = self.directory / "audit-policy.yaml"
            policy_file.write_text(yaml.safe_dump(dict(self.audit_policy)))
            self.audit_log.parent.mkdir(parents=True, exist_ok=True)
            audit_flags = _argv.audit(policy_file, self.audit_log)
        self._state_extra: dict[str, object] = {"server": server, "ports": ports}
        self._write_kubeconfig(server, pki)
        progress.advance(1, "pki + kubeconfig")

        self._spawn("etcd", _argv.etcd(bins, self.directory, ports), tie)
        self._wait_http("etcd", f"{_argv.etcd_url(ports)}/health", None)
        progress.advance(1, "etcd")

        argv = _argv.apiserver(bins, self.directory, ports, pki, audit_flags)
        self._spawn("kube-apiserver", argv, tie)
        self._wait_http("kube-apiserver", f"{server}/readyz", self._ssl_context(pki))
        progress.advance(1, "kube-apiserver")

        kc = str(self.kubeconfig)
        argv = _argv.controller_manager(bins, kc, ports, pki, self.tuning)
        self._spawn("kube-controller-manager", argv, tie)
        sched_config = self.directory / "scheduler.yaml"
        sched_config.write_text(yaml.safe_dump(_argv.scheduler_config(kc, self.tuning)))
        self._spawn("kube-scheduler", _argv.scheduler(bins, sched_config, kc, ports), tie)
        kwok_config = self.directory / "kwok.yaml"
        stages = (bins.kwok.parent / KWOK_STAGES).read_text()
        hold = self._node_images
        kwok_config.write_text(_argv.kwok_config(stages, self.tuning, hold=hold))
        self._spawn("kwok", _argv.kwok(bins, kwok_config, kc, ports), tie)
        if hold:
            # Before any node exists, so it sees every driver pod from the first.
            self._spawn(NODE_IMAGES, _argv.node_images(kc), tie, _argv.python_path())
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # components serve self-signed certs
        self._wait_http(
            "kube-controller-manager",
            f"https://127.0.0.1:{ports['controller-manager']}/healthz",
            insecure,
        )
        progress.advance(1, "kube-controller-manager")
        self._wait_http(
            "kube-scheduler", f"https://127.0.0.1:{ports['scheduler']}/healthz", insecure
        )
        progress.advance(1, "kube-scheduler")
        self._wait_http("kwok", f"http://127.0.0.1:{ports['kwok']}/healthz", None)
        progress.finish(f"up at {server}")
        return ClusterInfo(self.directory, server, self.kubeconfig, ports)

    # -------------------------------------------------------------- helpers
    def _ssl_context(self, pki: Pki) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        ctx.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        return ctx

    def _write_kubeconfig(self, server: str, pki: Pki) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpuop-local",
                    "cluster": {"server": server, "certificate-authority": str(pki.ca_cert)},
                }
            ],
            "users": [
                {
                    "name": "gpuop-admin",
                    "user": {
                        "client-certificate": str(pki.admin_cert),
                        "client-key": str(pki.admin_key),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "gpuop-local",
                    "context": {"cluster": "gpuop-local", "user": "gpuop-admin"},
                }
            ],
            "current-context": "gpuop-local",
        }
        from ._pki import write_private

        write_private(self.kubeconfig, yaml.safe_dump(config, sort_keys=False).encode())

    def _wait_http(self, name: str, url: str, ctx: ssl.SSLContext | None) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        last = ""
        while time.monotonic() < deadline:
            self._check_alive(name)
            try:
                with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as err:
                last = f"HTTP {err.code}"
            except (urllib.error.URLError, OSError) as err:
                last = str(getattr(err, "reason", err))
            time.sleep(0.25)
        raise ClusterError(
            f"{name} did not become healthy within {_START_TIMEOUT:.0f}s ({last})",
            f"see {self._log(name)}",
        )

    def _check_alive(self, name: str) -> None:
        """Fail fast with the process's own last words when it exited."""
        for record in self._records:
            proc = self._children.get(record.pid)
            if proc is None or proc.poll() is None:
                continue
            log = Path(record.log)
            tail = log.read_text(errors="replace").strip().splitlines()[-5:] if log.exists() else []
            text = " | ".join(tail)
            if "address already in use" in text:
                raise PortTaken(
                    f"{record.name} could not bind its port: address already in use",
                    "another process took the port; stop it or run again",
                )
            raise ClusterError(
                f"{record.name} exited with code {proc.returncode} while starting {name}: "
                f"{tail[-1] if tail else 'no output'}",
                f"see {log}",
            )

    async def _populate(
        self, nodes: int, gpu_nodes: int, dra: bool, workloads: Mapping[str, str] | None
    ) -> None:
        from gpuop.kube.client import api_client

        async with api_client(self.kubeconfig) as api:
            await create_nodes(api, nodes, gpu_nodes, workloads=workloads)
            await wait_nodes_ready(api, nodes)
            await wait_default_service_account(api)
            if dra:
                await publish_dra(api)
