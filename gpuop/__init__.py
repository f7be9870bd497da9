"""gpuop: a GPU operator for Kubernetes.

The process side of the project: CLI, API client, watch caches, workers, HTTP server,
logging and the local simulated cluster. The pure core lives in ``statemachine``,
``components`` and ``crd``.
"""

from importlib.metadata import PackageNotFoundError, version

from gpuop import _lazy_client

# Before anything imports kubernetes_asyncio: its generated classes load on demand.
_lazy_client.install()

try:
    __version__ = version("gpuop")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
