"""The CLI's way to the local cluster (`gpuop cluster`, `gpuop run` without a kubeconfig).

The simulator (`gpuop.devcluster`) and the NVML fake it seeds its nodes from ship in the
wheel, but not in the operator image (.dockerignore leaves them out): the operator and
node agent never import them (the import contracts in pyproject.toml say so), and the
CLI imports them only here, when a command asks for the local cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuop.devcluster import LocalCluster

PACKAGE = "gpuop.devcluster"


class LocalClusterMissing(Exception):
    """This install has no local cluster (the operator image): name what to use instead."""

    def __init__(self) -> None:
        super().__init__(
            "the local cluster is not part of this install (the operator image leaves it "
            "out): pass --kubeconfig, set $KUBECONFIG or run in a pod, or install gpuop "
            "from its source to use `gpuop cluster`"
        )


def _missing(err: ModuleNotFoundError) -> bool:
    return err.name is not None and (err.name == PACKAGE or PACKAGE.startswith(err.name + "."))


def require_local_cluster() -> None:
    """Raise `LocalClusterMissing` where this install has no local cluster."""
    try:
        import gpuop.devcluster  # noqa: F401
    except ModuleNotFoundError as err:
        if not _missing(err):
            raise
        raise LocalClusterMissing() from None


def local_cluster(directory: Path | None) -> LocalCluster:
    """The local cluster in `directory` (default: its usual place)."""
    require_local_cluster()
    from gpuop.devcluster import LocalCluster

    return LocalCluster(directory)


def cluster_errors() -> tuple[type[BaseException], ...]:
    """The local cluster's own expected error, where this install has the cluster."""
    try:
        from gpuop.devcluster import ClusterError
    except ModuleNotFoundError as err:
        if not _missing(err):
            raise
        return ()
    return (ClusterError,)
