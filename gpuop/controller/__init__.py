"""The controller: watch caches feed a work queue whose workers reconcile the
cluster-wide rollout (key ``cluster``) and each node (key ``node/<name>``).

Its floors, each importing only the ones below (import-linter, ``controller-floors``):
``_operator``, ``_router``, ``_caches`` wire; the passes (``_cluster``, ``_node``,
``_nvidiadriver``, ``_gpucluster``, ``_remediation``) decide; the writers talk to the
API server; the read-only views derive from caches; the base is shared by all.
Everything outside uses only the names below.
"""

from gpuop.controller._config import DEFAULT_NAMESPACE, DEFAULT_OPERATOR_IMAGE, OperatorConfig
from gpuop.controller._eviction import drain_rules, gpu_pod_rules
from gpuop.controller._gpucluster import conflict_message
from gpuop.controller._objects import is_policy_driver, nvd_owner
from gpuop.controller._operator import Operator
from gpuop.controller._rollout_gate import gate_policy
from gpuop.controller._upgrade_inputs import newest_revision, policy_view
from gpuop.controller._upgrade_window import waiting_nodes

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_OPERATOR_IMAGE",
    "Operator",
    "OperatorConfig",
    "conflict_message",
    "drain_rules",
    "gate_policy",
    "gpu_pod_rules",
    "is_policy_driver",
    "newest_revision",
    "nvd_owner",
    "policy_view",
    "waiting_nodes",
]
