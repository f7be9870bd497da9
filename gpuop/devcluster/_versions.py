"""Pinned versions of the control-plane binaries, and where they are cached."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.34.4"
ETCD_VERSION = "v3.5.35"
KWOK_VERSION = "v0.8.0"
#: The newest Helm 3 release whose go.mod still asks only for Go 1.24 (the
#: floor the README promises); it has no ``replace`` lines, so it builds directly.
HELM_VERSION = "v3.19.5"
#: Prometheus's Go module (v0.3XX.Y is Prometheus 3.XX.Y): promtool checks and
#: unit-tests the alert rules (components/data/gpu-operator.rules.yaml).
PROMTOOL_VERSION = "v0.316.0"

KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")


@dataclass(frozen=True)
class Versions:
    """Which releases to build; each can be overridden by an environment variable."""

    kubernetes: str = KUBERNETES_VERSION
    etcd: str = ETCD_VERSION
    kwok: str = KWOK_VERSION

    @classmethod
    def from_env(cls) -> Versions:
        return cls(
            kubernetes=os.environ.get("GPUOP_KUBERNETES_VERSION", KUBERNETES_VERSION),
            etcd=os.environ.get("GPUOP_ETCD_VERSION", ETCD_VERSION),
            kwok=os.environ.get("GPUOP_KWOK_VERSION", KWOK_VERSION),
        )


def cache_dir() -> Path:
    """``$GPUOP_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpuop``, else ``~/.cache/gpuop``."""
    explicit = os.environ.get("GPUOP_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "gpuop"


@dataclass(frozen=True)
class BinaryPaths:
    """Absolute paths of every binary the local cluster runs."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path

    @classmethod
    def under(cls, root: Path, versions: Versions) -> BinaryPaths:
        kube = root / "bin" / f"kubernetes-{versions.kubernetes}"
        return cls(
            etcd=root / "bin" / f"etcd-{versions.etcd}" / "etcd",
            kube_apiserver=kube / "kube-apiserver",
            kube_controller_manager=kube / "kube-controller-manager",
            kube_scheduler=kube / "kube-scheduler",
            kubectl=kube / "kubectl",
            kwok=root / "bin" / f"kwok-{versions.kwok}" / "kwok",
        )

    def all(self) -> tuple[Path, ...]:
        return (
            self.etcd,
            self.kube_apiserver,
            self.kube_controller_manager,
            self.kube_scheduler,
            self.kubectl,
            self.kwok,
        )


def helm_version() -> str:
    """``$GPUOP_HELM_VERSION``, else the pinned Helm release."""
    return os.environ.get("GPUOP_HELM_VERSION", HELM_VERSION)


def helm_path(root: Path, version: str) -> Path:
    """Where the Helm binary of ``version`` is cached under ``root``."""
    return root / "bin" / f"helm-{version}" / "helm"


def promtool_version() -> str:
    """``$GPUOP_PROMTOOL_VERSION``, else the pinned Prometheus module release."""
    return os.environ.get("GPUOP_PROMTOOL_VERSION", PROMTOOL_VERSION)


def promtool_path(root: Path, version: str) -> Path:
    """Where the promtool binary of ``version`` is cached under ``root``."""
    return root / "bin" / f"promtool-{version}" / "promtool"


def prometheus_version() -> str:
    """The Prometheus server is built from the same module release as promtool
    (``$GPUOP_PROMTOOL_VERSION`` moves both), so the rules they check agree."""
    return promtool_version()


def prometheus_path(root: Path, version: str) -> Path:
    """Where the Prometheus server binary of ``version`` is cached under ``root``."""
    return root / "bin" / f"prometheus-{version}" / "prometheus"
