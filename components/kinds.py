"""The Kubernetes kinds operands are made of, spelled once for every module."""

from __future__ import annotations

from components.component import ObjectKind

DAEMONSET = ObjectKind("apps/v1", "DaemonSet", "daemonsets")
SERVICE = ObjectKind("v1", "Service", "services")
SERVICE_ACCOUNT = ObjectKind("v1", "ServiceAccount", "serviceaccounts")
CONFIG_MAP = ObjectKind("v1", "ConfigMap", "configmaps")
ROLE = ObjectKind("rbac.authorization.k8s.io/v1", "Role", "roles")
ROLE_BINDING = ObjectKind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings")
CLUSTER_ROLE = ObjectKind("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", False)
CLUSTER_ROLE_BINDING = ObjectKind(
    "rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", False
)
RUNTIME_CLASS = ObjectKind("node.k8s.io/v1", "RuntimeClass", "runtimeclasses", False)
SERVICE_MONITOR = ObjectKind(
    "monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors", optional=True
)
PROMETHEUS_RULE = ObjectKind(
    "monitoring.coreos.com/v1", "PrometheusRule", "prometheusrules", optional=True
)

NAMESPACED_RBAC = (SERVICE_ACCOUNT, ROLE, ROLE_BINDING)
"""An operand's own account and namespaced permissions."""
CLUSTER_RBAC = (CLUSTER_ROLE, CLUSTER_ROLE_BINDING)
"""An operand's cluster-wide permissions (reading Nodes, mostly)."""
