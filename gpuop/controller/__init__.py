"""The controller: watch caches feed a work queue whose workers reconcile the
cluster-wide rollout (key ``cluster``) and each node (key ``node/<name>``)."""

from gpuop.controller._config import OperatorConfig
from gpuop.controller._operator import Operator

__all__ = ["Operator", "OperatorConfig"]
