"""What the operator's own RBAC must hold because of its operands, as data to check.

Two sources, both read from the operand registry: every permission an operand's Role or
ClusterRole grants (Kubernetes lets the operator grant only what it holds itself, short
of the broad `escalate`/`bind`), and every verb the controller uses on each kind it owns
(watch, server-side apply, prune). The chart's hand-written rules are checked against
this by a unit test, so an operand that needs more cannot ship without the chart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from components.component import Component, ObjectKind, Rule
from components.registry import cluster_roles, owned_kinds

NAMESPACED_VERBS = ("list", "watch", "create", "patch", "delete")
"""On a namespaced owned kind, in the operator namespace: watch, apply, prune."""
CLUSTER_VERBS = ("list", "watch")
"""On a cluster-scoped owned kind, cluster-wide (its cache)."""
CLUSTER_NAMED_VERBS = ("create", "patch", "delete")
"""On a cluster-scoped owned kind, by name only: server-side apply creates an object
with a PATCH to its name, which the API server authorizes as a `create` of that name."""


@dataclass(frozen=True)
class Need:
    """One permission the operator must hold."""

    cluster_wide: bool
    """Must a ClusterRole grant it (else a Role in the operator namespace may)?"""
    group: str
    resource: str
    verb: str
    name: str = ""
    """Only this object (empty: any)."""
    why: str = ""

    def __str__(self) -> str:
        scope = "cluster-wide" if self.cluster_wide else "in the operator namespace"
        named = f" {self.name}" if self.name else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource}{named} {scope} ({self.why})"


def allows(rules: Iterable[Rule], need: Need) -> bool:
    """Whether one of `rules` grants `need` (no wildcards: the chart uses none)."""
    for rule in rules:
        names = rule.get("resourceNames")
        if (
            need.group in rule.get("apiGroups", ())
            and need.resource in rule.get("resources", ())
            and need.verb in rule.get("verbs", ())
            and (not names or (need.name and need.name in names))
        ):
            return True
    return False


def operand_needs(
    components: Iterable[Component], cluster_names: Mapping[str, Iterable[str]] | None = None
) -> list[Need]:
    """Everything the operator must hold for these operands. `cluster_names` (kind ->
    names of the cluster-scoped objects rendered) adds the by-name verbs on each."""
    items = list(components)
    needs: list[Need] = []
    for comp in items:
        for cluster_wide, rules in (
            (False, comp.permissions.role),
            (True, comp.permissions.cluster),
        ):
            for rule in rules:
                needs += [
                    Need(cluster_wide, group, resource, verb, name, why=f"{comp.name} grants it")
                    for group in rule.get("apiGroups", ())
                    for resource in rule.get("resources", ())
                    for verb in rule.get("verbs", ())
                    for name in rule.get("resourceNames") or ("",)
                ]
    for kind in owned_kinds(items):
        why = f"owns {kind.kind}"
        verbs = NAMESPACED_VERBS if kind.namespaced else CLUSTER_VERBS
        needs += [Need(not kind.namespaced, kind.group, kind.plural, v, why=why) for v in verbs]
        for name in (cluster_names or {}).get(kind.kind, ()) if not kind.namespaced else ():
            needs += [
                Need(True, kind.group, kind.plural, v, name, why=why) for v in CLUSTER_NAMED_VERBS
            ]
    return needs


def missing(
    cluster_rules: Sequence[Rule], role_rules: Sequence[Rule], needs: Iterable[Need]
) -> list[Need]:
    """The needs the operator's ClusterRole (`cluster_rules`) and namespaced Role
    (`role_rules`) do not grant; a ClusterRole's grant holds in the namespace too."""
    namespaced = [*cluster_rules, *role_rules]
    return [n for n in needs if not allows(cluster_rules if n.cluster_wide else namespaced, n)]


def rendered_needs(
    objects: Iterable[Mapping[str, Any]], kinds: Iterable[ObjectKind], why: str
) -> list[Need]:
    """What the operator must hold to write `objects` (of `kinds`) as a controller with
    its own caches does: the rules their Roles and ClusterRoles grant, the verbs on each
    kind, and patch and delete by name on each cluster-scoped object."""
    listed = list(objects)
    needs: list[Need] = []
    for obj in listed:
        if obj.get("kind") not in ("Role", "ClusterRole"):
            continue
        grants = f"{obj['kind']} {obj['metadata']['name']} grants it"
        needs += [
            Need(obj["kind"] == "ClusterRole", group, resource, verb, why=grants)
            for rule in obj.get("rules") or ()
            for group in rule.get("apiGroups", ())
            for resource in rule.get("resources", ())
            for verb in rule.get("verbs", ())
        ]
    for kind in kinds:
        verbs = NAMESPACED_VERBS if kind.namespaced else CLUSTER_VERBS
        needs += [Need(not kind.namespaced, kind.group, kind.plural, v, why=why) for v in verbs]
        if kind.namespaced:
            continue
        needs += [
            Need(True, kind.group, kind.plural, v, str(obj["metadata"]["name"]), why=why)
            for obj in listed
            if obj.get("kind") == kind.kind
            for v in CLUSTER_NAMED_VERBS
        ]
    return needs


CHART_ROLES_FILE = "deploy/helm/gpu-operator/files/operand-roles.yaml"
"""The chart's list of operand ClusterRoles (read by its templates/rbac.yaml)."""
_CHART_ROLES_HEADER = """\
# The ClusterRoles (and ClusterRoleBindings) of the operands' accounts: the only ones
# the operator may create, change and delete (templates/rbac.yaml names them). Generated
# from the operand registry (components.rbac.chart_roles_yaml) -- do not edit;
# regenerate with
#   python -m tests.integration.helm_chart
"""


def chart_roles_yaml(components: Iterable[Component]) -> str:
    """The text of the chart's `files/operand-roles.yaml` for these operands."""
    return _CHART_ROLES_HEADER + "".join(f"- {name}\n" for name in cluster_roles(components))


def chart_roles_missing(text: str, components: Iterable[Component]) -> list[str]:
    """The operand ClusterRoles the chart's roles file (`text`) does not name: each one
    the operator could not write, so its operand could not be installed."""
    listed = {line[2:].strip() for line in text.splitlines() if line.startswith("- ")}
    return [name for name in cluster_roles(components) if name not in listed]
