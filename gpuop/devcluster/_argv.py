"""The control plane's command lines and configuration files: pure functions of the
state directory, the binaries, the ports, the PKI and the client tuning.

Split from `_cluster` (which spawns the processes, waits for them and tears them down)
so each process's flags are read in one place and `_start` reads as the order of start.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._stages import CLAIM_POD_TERMINATED_STAGE, WORKLOAD_COMPLETE_STAGE, hold_pod_ready
from ._versions import BinaryPaths

if TYPE_CHECKING:
    from ._pki import Pki


@dataclass(frozen=True)
class ClientTuning:
    """Client rates for the controller manager and scheduler, and kwok's parallelism
    (raise for big fleets; kwok's own client is not rate-limited)."""

    qps: int = 100
    burst: int = 200
    #: Workers per kwok stage loop (pod and node stages, leases, pods-on-node sync).
    kwok_parallelism: int = 16
    #: kube-controller-manager's --node-monitor-grace-period (None: its default).
    #: With thousands of simulated nodes on 2 cores kwok's lease renewals fall
    #: behind; a node marked NotReady for a moment leaves its pods not Ready for
    #: good (no kubelet to set them Ready again), so big runs raise this.
    node_monitor_grace_period: str | None = None


def etcd_url(ports: dict[str, int]) -> str:
    return f"http://127.0.0.1:{ports['etcd']}"


def etcd(bins: BinaryPaths, directory: Path, ports: dict[str, int]) -> list[str]:
    url, peer_url = etcd_url(ports), f"http://127.0.0.1:{ports['etcd-peer']}"
    return [
        str(bins.etcd),
        f"--data-dir={directory / 'etcd'}",
        f"--listen-client-urls={url}",
        f"--advertise-client-urls={url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=default={peer_url}",
        "--unsafe-no-fsync=true",
        "--quota-backend-bytes=4294967296",
        "--log-level=warn",
    ]


def audit(policy_file: Path, audit_log: Path) -> list[str]:
    """kube-apiserver's flags for a JSON audit log under `policy_file`."""
    return [
        f"--audit-policy-file={policy_file}",
        f"--audit-log-path={audit_log}",
        "--audit-log-format=json",
        "--audit-log-maxsize=0",
    ]


def apiserver(
    bins: BinaryPaths,
    directory: Path,
    ports: dict[str, int],
    pki: Pki,
    audit_flags: list[str],
) -> list[str]:
    return [
        str(bins.kube_apiserver),
        f"--etcd-servers={etcd_url(ports)}",
        f"--secure-port={ports['apiserver']}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--cert-dir={directory / 'pki'}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--authorization-mode=RBAC",
        "--allow-privileged=true",
        "--enable-priority-and-fairness=true",
        "--max-requests-inflight=1000",
        "--max-mutating-requests-inflight=500",
        # PodTemplates bypass the watch cache, so watches on them read etcd
        # directly and expire for real once history is compacted (tests).
        "--watch-cache-sizes=podtemplates#0",
        "--v=1",
        *audit_flags,
    ]


def controller_manager(
    bins: BinaryPaths, kubeconfig: str, ports: dict[str, int], pki: Pki, tuning: ClientTuning
) -> list[str]:
    grace = tuning.node_monitor_grace_period
    return [
        str(bins.kube_controller_manager),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports['controller-manager']}",
        f"--service-account-private-key-file={pki.sa_key}",
        f"--root-ca-file={pki.ca_cert}",
        "--use-service-account-credentials=false",
        f"--kube-api-qps={tuning.qps}",
        f"--kube-api-burst={tuning.burst}",
        "--concurrent-daemonset-syncs=4",
        *([f"--node-monitor-grace-period={grace}"] if grace else []),
        "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller",
        "--v=1",
    ]


def scheduler_config(kubeconfig: str, tuning: ClientTuning) -> dict[str, Any]:
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig, "qps": tuning.qps, "burst": tuning.burst},
        "leaderElection": {"leaderElect": False},
    }


def scheduler(bins: BinaryPaths, config: Path, kubeconfig: str, ports: dict[str, int]) -> list[str]:
    return [
        str(bins.kube_scheduler),
        f"--config={config}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports['scheduler']}",
        "--v=1",
    ]


def kwok_config(stages: str, tuning: ClientTuning, hold: bool = False) -> str:
    """An explicit configuration keeps a user's ~/.kwok/kwok.yaml out of the picture;
    the `stages` (saved beside the binary at build time) give nodes a Ready heartbeat
    and make pods Running and Ready. With `hold` (the node-image simulator runs) the
    pods it plays stay not Ready until it releases them."""
    if hold:
        stages = hold_pod_ready(stages)
    par = tuning.kwok_parallelism
    return (
        "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\n"
        "options:\n"
        f"  podPlayStageParallelism: {par}\n"
        f"  nodePlayStageParallelism: {par}\n"
        f"  nodeLeaseParallelism: {par}\n"
        f"  podsOnNodeSyncParallelism: {par}\n"
        f"---\n{stages}\n---\n{WORKLOAD_COMPLETE_STAGE}\n---\n{CLAIM_POD_TERMINATED_STAGE}"
    )


def kwok(bins: BinaryPaths, config: Path, kubeconfig: str, ports: dict[str, int]) -> list[str]:
    return [
        str(bins.kwok),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        "--node-lease-duration-seconds=40",
        f"--server-address=127.0.0.1:{ports['kwok']}",
        "--cidr=10.244.0.0/16",
        "--node-ip=10.240.0.1",
        "--v=INFO",
    ]


def node_images(kubeconfig: str) -> list[str]:
    """The node-image simulator, run by this interpreter (``gpuop.devcluster.node_images``)."""
    return [sys.executable, "-m", "gpuop.devcluster.node_images", f"--kubeconfig={kubeconfig}"]


def python_path() -> dict[str, str]:
    """``PYTHONPATH`` for a child interpreter that must import this very ``gpuop`` (a
    checkout, not an older installed copy), ahead of whatever the caller had."""
    import gpuop

    root = str(Path(gpuop.__file__).resolve().parent.parent)
    rest = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([root, rest]) if rest else root}
