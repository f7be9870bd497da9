"""Which ClusterPolicy is in force: the oldest one (by creation, then name).

Every pass of every unit asks (each node pass too), so the answer is parsed and
validated once per resourceVersion, not once per question.
"""

from __future__ import annotations

from collections.abc import Callable

from crd import ClusterPolicy, ClusterPolicySpec, parse_policy
from gpuop.kube.informer import Informer, Obj
from gpuop.operator.controller.base.memo import VersionMemo

Parsed = tuple[ClusterPolicy | None, list[str]]
"""The model (None when it does not parse) and each problem as ``path: message``."""
InForce = tuple[Obj | None, ClusterPolicy | None, list[str]]
"""The active policy as stored (None: there is none), its model and its problems."""
ActivePolicy = Callable[[], InForce]


class ActivePolicies:
    """The active ClusterPolicy over the policies cache."""

    def __init__(self, policies: Informer) -> None:
        self.policies = policies
        self._parsed: VersionMemo[str, Parsed] = VersionMemo()

    def __call__(self) -> InForce:
        policies = sorted(
            self.policies.values(),
            key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]),
        )
        if not policies:
            return None, None, []
        raw = policies[0]
        rv = str(raw["metadata"].get("resourceVersion"))
        model, problems = self._parsed.get("active", rv, lambda: _parse(raw))
        return raw, model, problems

    def spec(self) -> ClusterPolicySpec | None:
        """The active policy's spec; None when there is none or it is invalid."""
        _, model, problems = self()
        return model.spec if model is not None and not problems else None


def _parse(raw: Obj) -> Parsed:
    model, problems = parse_policy(raw)
    return model, [f"{p.path}: {p.message}" for p in problems]
