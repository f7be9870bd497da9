"""gpuop: a GPU operator for Kubernetes.

The process side of the project, one wing per program: the operator
(``gpuop.operator``), the node agent (``gpuop.nodeagent``), the local development
cluster (``gpuop.devcluster``) and the Kubernetes client they share (``gpuop.kube``);
the CLI, logging and progress at the top. The pure core lives in ``statemachine``,
``components`` and ``crd``.
"""

from importlib.metadata import PackageNotFoundError, version

from gpuop.kube import _lazy_client

# Before anything imports kubernetes_asyncio: its generated classes load on demand.
_lazy_client.install()

try:
    __version__ = version("gpuop")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
