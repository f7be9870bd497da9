"""The controller: watch caches feed a work queue whose workers reconcile the
cluster-wide rollout (key ``cluster``) and each node (key ``node/<name>``).

Its floors, each importing only the ones below (import-linter, ``controller-floors``):
``wiring`` builds and routes; ``passes`` (cluster, node, nvidiadriver, gpucluster,
remediation: independent of each other) decide; ``writers`` talk to the API server;
``views`` derive from caches, read-only; ``base`` is shared by all. Everything outside
uses only the names below (``controller-public``).
"""

from gpuop.operator.controller.base.config import (
    DEFAULT_NAMESPACE,
    DEFAULT_OPERATOR_IMAGE,
    OperatorConfig,
)
from gpuop.operator.controller.passes.gpucluster import conflict_message
from gpuop.operator.controller.views.objects import is_policy_driver, nvd_owner
from gpuop.operator.controller.views.upgrade_inputs import newest_revision, policy_view
from gpuop.operator.controller.wiring.operator import Operator
from gpuop.operator.controller.writers.rollout_gate import gate_policy
from gpuop.operator.controller.writers.upgrade_window import waiting_nodes
from statemachine.eviction import drain_rules, gpu_pod_rules

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
