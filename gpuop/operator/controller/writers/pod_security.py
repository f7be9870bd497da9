"""`spec.psa.enabled`: the operator's namespace gets Pod Security labels that admit its
privileged operands.

A cluster that enforces the `baseline` or `restricted` Pod Security Standard by default
refuses every operand pod (they are privileged, use host paths and host PID) unless their
namespace says `privileged`. Upstream sets `pod-security.kubernetes.io/{enforce,audit,
warn}=privileged` on its namespace when the policy asks; so do we, once per policy
generation (one GET, and a patch only when a label is missing or different).
"""

from __future__ import annotations

from gpuop.kube.kinds import by_kind
from gpuop.kube.rest import Rest
from gpuop.log import get_logger

log = get_logger(__name__)

NAMESPACE = by_kind("v1", "Namespace")
PRIVILEGED = "privileged"
PSA_LABELS = {
    f"pod-security.kubernetes.io/{mode}": PRIVILEGED for mode in ("enforce", "audit", "warn")
}


def missing_labels(labels: dict[str, str]) -> dict[str, str]:
    """The Pod Security labels a namespace lacks (or has with another level)."""
    return {k: v for k, v in PSA_LABELS.items() if labels.get(k) != v}


class PodSecurityLabels:
    """Labels the operator's namespace once per policy generation that asks for it."""

    def __init__(self, rest: Rest, namespace: str) -> None:
        self._rest = rest
        self._namespace = namespace
        self._done_for: object = None

    async def ensure(self, enabled: bool, policy_key: object) -> None:
        if not enabled or self._done_for == policy_key:
            return
        ns = await self._rest.get(NAMESPACE, self._namespace)
        labels = ((ns or {}).get("metadata") or {}).get("labels") or {}
        missing = missing_labels(labels)
        if ns is not None and missing:
            await self._rest.merge_patch(
                NAMESPACE, self._namespace, {"metadata": {"labels": missing}}
            )
            log.info(
                "namespace labelled for Pod Security", namespace=self._namespace, labels=missing
            )
        self._done_for = policy_key
