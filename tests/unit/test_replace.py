"""Replacing a DaemonSet whose selector must change: orphan-delete, create, and only the
old pods the new selector leaves out are deleted."""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from gpuop.operator.controller.writers.replace import replace_orphaning, selector_refused

IMMUTABLE = (
    '{"kind":"Status","message":"DaemonSet.apps \\"gpu-feature-discovery\\" is invalid: '
    'spec.selector: Invalid value: ...: field is immutable","code":422}'
)


def _ds(selector: dict[str, str], uid: str = "old") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "gfd", "namespace": "ns", "uid": uid},
        "spec": {"selector": {"matchLabels": selector}},
    }


def _pod(name: str, labels: dict[str, str], deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


class _Rest:
    def __init__(self, current: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        self.current: dict[str, Any] | None = current
        self.pods = pods
        self.calls: list[tuple[str, Any]] = []

    async def get(self, kind: Any, name: str, namespace: str | None = None) -> Any:
        return self.current

    async def delete(
        self, kind: Any, name: str, namespace: str | None = None, body: Any = None
    ) -> bool:
        self.calls.append(("delete", (kind.kind, name, body)))
        if kind.kind == "DaemonSet":
            self.current = None
        return True

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("apply", obj["metadata"]["name"]))
        return {**obj, "metadata": {**obj["metadata"], "uid": "new"}}

    async def list(self, kind: Any, namespace: str | None = None) -> list[dict[str, Any]]:
        return self.pods


def test_only_an_immutable_selector_refusal_counts() -> None:
    ds = _ds({"app": "gfd"})
    assert selector_refused(ds, ApiException(status=422, reason=IMMUTABLE))
    assert not selector_refused(ds, ApiException(status=409, reason=IMMUTABLE))
    assert not selector_refused(ds, ApiException(status=422, reason="spec.template: bad"))
    config_map = {**ds, "kind": "ConfigMap"}
    assert not selector_refused(config_map, ApiException(status=422, reason=IMMUTABLE))


def test_replace_orphans_the_pods_then_creates_and_drops_only_unadopted_pods() -> None:
    new = _ds({"app": "gfd", "part-of": "nvidia-gpu"})
    adopted = _pod("adopted", {"app": "gfd", "part-of": "nvidia-gpu"})
    left_out = _pod("left-out", {"app": "gfd", "part-of": "gpu-operator"})
    going = _pod("going", {"app": "gfd"}, deleting=True)
    workload = _pod("trainer", {"app": "trainer"})
    rest = _Rest(_ds({"app": "gfd"}), [adopted, left_out, going, workload])
    created, words = asyncio.run(replace_orphaning(rest, new))  # type: ignore[arg-type]
    assert rest.calls == [
        (
            "delete",
            (
                "DaemonSet",
                "gfd",
                {"propagationPolicy": "Orphan", "preconditions": {"uid": "old"}},
            ),
        ),
        ("apply", "gfd"),
        ("delete", ("Pod", "left-out", None)),
    ]
    assert created["metadata"]["uid"] == "new"
    assert "orphaned" in words
    assert "1 pod(s)" in words
