"""The benchmark's moving parts: a fresh audited cluster per run, the operator as a
separate process with its own identity, and small polling helpers."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpuop.devcluster import SIMULATED_LABEL, ClientTuning, LocalCluster
from gpuop.kube.client import api_client
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.install import ensure_namespace, install_crd

from ._audit import AUDIT_POLICY, OPERATOR_USER, AuditCounter, wall_seconds

NAMESPACE = "gpu-operator"
POLICY = by_kind("nvidia.com/v1", "ClusterPolicy")
NODE = by_kind("v1", "Node")
DS = by_kind("apps/v1", "DaemonSet")
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Settings:
    """Everything that shapes a figure; printed and stored with the results."""

    cluster_dir: Path
    tuning: ClientTuning
    cpu_nodes: int
    operator_src: Path
    workers: int

    def describe(self) -> dict[str, Any]:
        return {
            "kcm_and_scheduler_qps": self.tuning.qps,
            "kcm_and_scheduler_burst": self.tuning.burst,
            "kwok_parallelism": self.tuning.kwok_parallelism,
            "node_monitor_grace_period": self.tuning.node_monitor_grace_period,
            "kwok_client_rate": "unlimited (kwok's own client has no rate limiter)",
            "kcm_concurrent_daemonset_syncs": 4,
            "cpu_nodes_per_cluster": self.cpu_nodes,
            "operator_workers": self.workers,
            "operator_source": str(self.operator_src),
        }


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of one process so far, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat(5); [0] here is field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ClusterCpu:
    """CPU seconds each control-plane process spent between ``start`` and ``take``:
    on two shared cores the operator run and the baseline differ in where the time
    went, not only in how much there was."""

    def __init__(self, bench: BenchCluster) -> None:
        self._pids = bench.cluster.pids()
        self._before: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        now: dict[str, float] = {}
        for name, pid in self._pids.items():
            try:
                now[name] = process_cpu_seconds(pid)
            except (FileNotFoundError, ProcessLookupError):
                continue
        return now

    def start(self) -> None:
        self._before = self._now()

    def take(self) -> dict[str, float]:
        after = self._now()
        return {k: round(v - self._before.get(k, 0.0), 2) for k, v in sorted(after.items())}


def _wait_until(check: Callable[[], bool], timeout: float, interval: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(interval)


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout: float, interval: float, what: str
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        await asyncio.sleep(interval)


# --------------------------------------------------------------------- cluster
#: ``LocalCluster.up`` runs its own event loop, so it runs off the benchmark's loop,
#: always on this one long-lived thread: the control plane's processes are tied to
#: the thread that started them (PR_SET_PDEATHSIG) and die with the benchmark.
_OWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cluster-owner")


class BenchCluster:
    """One fresh local control plane (audited), torn down on exit."""

    def __init__(self, settings: Settings, gpu_nodes: int, audit: bool = True) -> None:
        self.settings = settings
        self.gpu_nodes = gpu_nodes
        self.nodes = gpu_nodes + settings.cpu_nodes
        self.cluster = LocalCluster(
            settings.cluster_dir,
            tuning=settings.tuning,
            audit_policy=AUDIT_POLICY if audit else None,
        )
        self.audit = AuditCounter(self.cluster.audit_log)
        self.operator_kubeconfig = self.cluster.directory / "operator.kubeconfig"

    async def __aenter__(self) -> BenchCluster:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(_OWNER, self._up)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.get_running_loop().run_in_executor(_OWNER, self.cluster.down)

    def _up(self) -> None:
        self.cluster.down()
        # no DRA slices: the operator never reads them, and they would only slow the
        # start of big fleets and change the control plane that earlier numbers measured
        self.cluster.up(self.nodes, self.gpu_nodes, tie_to_parent=True, dra=False)
        try:
            self._mint_operator_identity()
        except BaseException:
            self.cluster.down()
            raise

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    def _mint_operator_identity(self) -> None:
        """A client certificate of its own (user ``OPERATOR_USER``, group
        ``system:masters``) so the audit log can tell the operator's requests apart."""
        pki = self.cluster.directory / "pki"
        ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, OPERATOR_USER),
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            ]
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
            )
            .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
        )
        cert_path, key_path = pki / "operator.crt", pki / "operator.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        config = yaml.safe_load(self.cluster.kubeconfig.read_text())
        config["users"] = [
            {
                "name": OPERATOR_USER,
                "user": {"client-certificate": str(cert_path), "client-key": str(key_path)},
            }
        ]
        config["contexts"][0]["context"]["user"] = OPERATOR_USER
        self.operator_kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))

    @asynccontextmanager
    async def admin(self) -> AsyncIterator[Rest]:
        async with api_client(self.kubeconfig, user_agent="gpuop-bench") as api:
            yield Rest(api, KINDS)

    async def prepare(self, rest: Rest) -> None:
        await install_crd(rest)
        await ensure_namespace(rest, NAMESPACE)


# -------------------------------------------------------------------- operator
_TS = re.compile(r'"timestamp":\s*"([^"]+)"')


@dataclass
class Startup:
    synced_s: float | None = None
    first_reconcile_s: float | None = None


@dataclass
class OperatorProcess:
    """``gpuop run`` in its own process: RSS from /proc, timings from logs and /metrics."""

    kubeconfig: Path
    log_path: Path
    src: Path
    workers: int = 8
    metrics_port: int = 0
    probe_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    started_wall: float = 0.0
    started_mono: float = 0.0
    rss_samples: list[float] = field(default_factory=list)

    def start(self) -> None:
        from gpuop.devcluster._cluster import _free_port

        self.metrics_port = _free_port()
        self.probe_port = _free_port()
        env = dict(os.environ)
        env["PYTHONPATH"] = str(self.src) + os.pathsep + env.get("PYTHONPATH", "")
        # GPUOP_BENCH_PROFILE=DIR: each operator process under cProfile, for finding
        # where its CPU goes (slower; never for the figures themselves).
        profile_dir = os.environ.get("GPUOP_BENCH_PROFILE")
        profile = (
            ["-m", "cProfile", "-o", str(Path(profile_dir) / f"{self.log_path.stem}.prof")]
            if profile_dir
            else []
        )
        # GPUOP_BENCH_TRACEMALLOC=DIR: the operator under tracemalloc; dump_memory()
        # writes a snapshot there (where memory grows with the fleet; never figures).
        snapshot = self._snapshot_path()
        if snapshot is not None:
            env["GPUOP_MEMTRACE_OUT"] = str(snapshot)
        # GPUOP_BENCH_CPU_BY_TASK=DIR: the operator's CPU per task and callback, a
        # snapshot every few seconds (tests.bench._cpu_by_task; never figures).
        by_task = os.environ.get("GPUOP_BENCH_CPU_BY_TASK")
        if by_task:
            env["GPUOP_CPU_BY_TASK_OUT"] = str(Path(by_task) / f"{self.log_path.stem}.jsonl")
        module = "gpuop"
        if snapshot is not None:
            module = "tests.bench._memtrace"
        elif by_task:
            module = "tests.bench._cpu_by_task"
        argv = [
            sys.executable,
            *profile,
            "-m",
            module,
            "--log-format",
            "json",
            "run",
            "--kubeconfig",
            str(self.kubeconfig),
            "--namespace",
            NAMESPACE,
            "--workers",
            str(self.workers),
            "--metrics-port",
            str(self.metrics_port),
            "--probe-port",
            str(self.probe_port),
        ]
        log = self.log_path.open("ab")
        self.started_wall = time.time()
        self.started_mono = time.monotonic()
        self.proc = subprocess.Popen(
            argv, cwd=self.src, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-5:]
            raise RuntimeError(f"operator exited with {self.proc.returncode}: " + " | ".join(tail))

    def _get(self, port: int, path: str) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
                return str(resp.read().decode())
        except (urllib.error.URLError, OSError):
            return None

    def ready(self) -> bool:
        self._alive()
        return self._get(self.probe_port, "/readyz") is not None

    def metric(self, name: str) -> float | None:
        text = self._get(self.metrics_port, "/metrics")
        if text is None:
            return None
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def wait_ready(self, timeout: float = 300.0) -> None:
        _wait_until(self.ready, timeout, 0.05, "operator /readyz")

    def measure_startup(self, timeout: float = 300.0) -> Startup:
        """Poll /metrics from process start until the first ClusterPolicy reconcile
        has run; the cache-sync moment comes from the operator's own log line."""
        result = Startup()
        deadline = time.monotonic() + timeout
        while True:
            self._alive()
            value = self.metric("gpu_operator_reconciliation_total")
            if value is not None and value >= 1:
                result.first_reconcile_s = time.monotonic() - self.started_mono
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        result.synced_s = self.synced_after()
        return result

    def synced_after(self) -> float | None:
        """Seconds from process start to the last 'caches synced' log line's timestamp."""
        times = self.event_times("caches synced")
        return times[-1] - self.started_wall if times else None

    def event_times(self, event: str) -> list[float]:
        """Wall-clock times of the operator's log lines with this ``event``."""
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if f'"event": "{event}"' not in line:
                continue
            match = _TS.search(line)
            stamp = wall_seconds(match.group(1)) if match else None
            if stamp is not None:
                found.append(stamp)
        return found

    def status(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(key)

    def _snapshot_path(self) -> Path | None:
        trace_dir = os.environ.get("GPUOP_BENCH_TRACEMALLOC")
        return Path(trace_dir) / f"{self.log_path.stem}.snap" if trace_dir else None

    def dump_memory(self, timeout: float = 120.0) -> None:
        """Under ``GPUOP_BENCH_TRACEMALLOC``: have the operator write its snapshot."""
        out = self._snapshot_path()
        if out is None:
            return
        done = out.with_name(out.name + ".done")
        done.unlink(missing_ok=True)
        os.kill(self.pid, signal.SIGUSR1)
        _wait_until(done.exists, timeout, 0.5, f"tracemalloc snapshot {out}")

    def peak_rss_mib(self) -> float:
        return self.status("VmHWM") / 2**20

    def cpu_seconds(self) -> float:
        """User plus system CPU time so far: on a small machine the operator's CPU is
        taken from the control plane it waits on, so it belongs beside time to ready."""
        return process_cpu_seconds(self.pid)

    def rss_mib(self) -> float:
        return self.status("VmRSS") / 2**20

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def errors(self) -> list[str]:
        """Warning and error lines the operator logged (reported with the figures)."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if '"level": "warning"' in line or '"level": "error"' in line:
                out.append(line[:300])
        return out


# ---------------------------------------------------------------- cluster views
async def policy_state(rest: Rest) -> str | None:
    got = await rest.get(POLICY, "cluster-policy")
    return ((got or {}).get("status") or {}).get("state")


async def gpu_node_names(rest: Rest) -> list[str]:
    nodes = await rest.list(NODE, label_selector=f"{SIMULATED_LABEL}=true")
    return sorted(
        n["metadata"]["name"]
        for n in nodes
        if n["metadata"].get("labels", {}).get("feature.node.kubernetes.io/pci-10de.present")
        == "true"
    )


def dump_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
